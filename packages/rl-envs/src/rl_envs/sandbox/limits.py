"""What a sandboxed run may use (`SandboxLimits`) and what it produced (`ExecutionResult`)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

StopReason = Literal[
    "exited",
    "timeout",
    "cpu_limit",
    "memory_limit",
    "file_size_limit",
    "disk_full",
    "output_limit",
    "signal",
]
"""Why a sandboxed program stopped:

- `exited`: it ended on its own (any exit status; a Python exception exits with 1).
- `timeout`: still running after `wall_seconds`; killed, with every process it started.
- `cpu_limit`: used `cpu_seconds` of CPU (SIGXCPU, then SIGKILL one second later).
- `memory_limit`: an allocation failed under `memory_bytes` (Python's `MemoryError`).
- `file_size_limit`: a write went past `file_size_bytes` (`OSError` EFBIG, "File too large").
- `disk_full`: the private `/tmp` (or `/dev/shm`) of `tmp_bytes` is full (ENOSPC).
- `output_limit`: wrote more than `output_bytes` to stdout or stderr; killed.
- `signal`: killed by another signal (SIGSEGV, SIGKILL, ...).

`memory_limit`, `file_size_limit` and `disk_full` are read from the last line of the
program's stderr when it exited with a non-zero status: a program can catch those errors
and carry on, and it can print such a line itself (it only misreports its own run).
"""

_MiB = 1 << 20


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run; every field must be > 0 (checked on construction, the
    error names the field).

    Attributes:
        cpu_seconds: CPU time, whole seconds (RLIMIT_CPU, per process).
        memory_bytes: address space per process (RLIMIT_AS). Per process: a program that
            forks N children may use up to N times this; `max_processes` bounds N.
        file_size_bytes: largest file a process may write (RLIMIT_FSIZE).
        max_processes: processes and threads in the sandbox, the program included
            (RLIMIT_NPROC, counted in the sandbox's own user namespace).
        open_files: file descriptors per process (RLIMIT_NOFILE).
        wall_seconds: wall-clock time before the whole sandbox is killed.
        output_bytes: bytes kept from stdout and from stderr, each; writing more kills
            the program (`stopped == "output_limit"`).
        tmp_bytes: size of the private writable `/tmp`, and of `/dev/shm` (tmpfs, held in
            the host's memory, so this caps what the program can park there).
    """

    cpu_seconds: int = 5
    memory_bytes: int = 512 * _MiB
    file_size_bytes: int = 16 * _MiB
    max_processes: int = 16
    open_files: int = 64
    wall_seconds: float = 10.0
    output_bytes: int = 64 * 1024
    tmp_bytes: int = 64 * _MiB

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            floating = name == "wall_seconds"
            ok = isinstance(value, int | float) if floating else isinstance(value, int)
            if isinstance(value, bool) or not ok:
                kind = "a number" if floating else "an int"
                raise TypeError(f"SandboxLimits.{name} must be {kind}, got {type(value).__name__}")
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {value!r}")


@dataclass(frozen=True)
class ExecutionResult:
    """What one sandboxed run produced.

    Attributes:
        stdout: the program's standard output, decoded as UTF-8 (invalid bytes replaced),
            at most `output_bytes` bytes of it.
        stderr: the same for standard error (a Python traceback lands here).
        exit_code: the exit status when the program exited on its own (0 = success), else
            None.
        signal: the number of the signal that killed the program, else None.
        stopped: why it stopped (see `StopReason`).
        wall_seconds: wall-clock time of the run, sandbox start-up included.
        stdout_truncated: stdout was cut at `output_bytes`.
        stderr_truncated: stderr was cut at `output_bytes`.
        isolated: True when it ran inside bubblewrap; False only with the explicit
            `unsafe_no_isolation` debugging switch.
    """

    stdout: str
    stderr: str
    exit_code: int | None
    signal: int | None
    stopped: StopReason
    wall_seconds: float
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    isolated: bool = True

    @property
    def ok(self) -> bool:
        """The program exited on its own with status 0."""
        return self.stopped == "exited" and self.exit_code == 0

    def to_json(self) -> dict[str, Any]:
        """The result as a JSON-ready dict (every field, plus `ok`)."""
        return {**asdict(self), "ok": self.ok}
