"""`Sandbox`: runs one untrusted Python program in bubblewrap and reports what happened."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from rl_envs.sandbox._bwrap import (
    Runtime,
    SandboxUnavailableError,
    command,
    environment,
    find_runtime,
    interpreter_args,
)
from rl_envs.sandbox.limits import ExecutionResult, SandboxLimits, StopReason

_READ_CHUNK = 1 << 16
_REAP_GRACE_S = 5.0  # after a kill, how long pipes may take to close before we stop reading


class SandboxError(RuntimeError):
    """The sandbox itself failed to start a run (not the program); the message has
    bubblewrap's error."""


@dataclass
class _Stream:
    data: bytearray
    truncated: bool = False


class Sandbox:
    """Runs untrusted Python programs, each in a fresh bubblewrap sandbox (see the package
    README for what a program can and cannot reach).

        sandbox = Sandbox(SandboxLimits(wall_seconds=5))
        result = sandbox.run("print(6 * 7)")          # or: await sandbox.arun(...)
        assert result.ok and result.stdout == "42\\n"

    Construction checks that isolation works on this machine (one probe run per process)
    and raises `SandboxUnavailableError`, naming what is missing, if it does not.
    `unsafe_no_isolation=True` runs programs as plain child processes with the same
    rlimits, timeout and output cap but NO isolation (they see the host's files and
    network); it exists for debugging on machines without bubblewrap, warns, and marks
    every result `isolated=False`.
    """

    def __init__(
        self, limits: SandboxLimits | None = None, *, unsafe_no_isolation: bool = False
    ) -> None:
        self.limits = _check_limits(limits) if limits is not None else SandboxLimits()
        self.isolated = not unsafe_no_isolation
        self._runtime: Runtime | None = None
        if unsafe_no_isolation:
            warnings.warn(
                "rl_envs Sandbox(unsafe_no_isolation=True): programs run WITHOUT isolation "
                "(host files and network are reachable); use it for debugging only",
                RuntimeWarning,
                stacklevel=2,
            )
        else:
            self._runtime = find_runtime()
            _probe(self._runtime)

    def run(
        self, program: str, *, stdin: str = "", limits: SandboxLimits | None = None
    ) -> ExecutionResult:
        """Runs `program` (Python source text) to completion; blocking. Inside a running
        event loop, use `await arun(...)` instead."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.arun(program, stdin=stdin, limits=limits))
        raise RuntimeError("Sandbox.run() blocks; inside an event loop use `await arun()`")

    async def arun(
        self, program: str, *, stdin: str = "", limits: SandboxLimits | None = None
    ) -> ExecutionResult:
        """Runs `program` (Python source text) with `stdin` as its standard input, under
        `limits` (default: the sandbox's), and returns what happened. Never raises because
        of what the program did; raises `TypeError` / `ValueError` for bad arguments, and
        `SandboxError` if the sandbox itself could not start."""
        if not isinstance(program, str):
            raise TypeError(f"program must be text (str), got {type(program).__name__}")
        if not isinstance(stdin, str):
            raise TypeError(f"stdin must be text (str), got {type(stdin).__name__}")
        limits = self.limits if limits is None else _check_limits(limits)
        try:
            source = program.encode("utf-8")
            stdin_bytes = stdin.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"program and stdin must be valid Unicode text: {e}") from None
        run_id = f"rl-envs-{uuid.uuid4().hex[:16]}"
        if self._runtime is None:
            return await _run_unisolated(source, stdin_bytes, limits, run_id)
        return await _run_isolated(self._runtime, source, stdin_bytes, limits, run_id)


async def _run_isolated(
    runtime: Runtime, source: bytes, stdin: bytes, limits: SandboxLimits, run_id: str
) -> ExecutionResult:
    program_fd = os.memfd_create("rl-envs-program", os.MFD_CLOEXEC)
    # One per run: bubblewrap reads it with read(), which moves an offset that runs in
    # flight at once would share.
    seccomp_fd = os.memfd_create("rl-envs-seccomp", os.MFD_CLOEXEC)
    status_r, status_w = os.pipe()
    try:
        for fd, data in ((program_fd, source), (seccomp_fd, runtime.seccomp)):
            _write_all(fd, data)
            os.lseek(fd, 0, os.SEEK_SET)
        argv = command(
            runtime,
            limits,
            program_fd=program_fd,
            status_fd=status_w,
            seccomp_fd=seccomp_fd,
            run_id=run_id,
        )
        start = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            pass_fds=(program_fd, status_w, seccomp_fd),
            start_new_session=True,
            env={"PATH": "/usr/bin:/bin"},
        )
    finally:
        os.close(program_fd)
        os.close(seccomp_fd)
        os.close(status_w)
    try:
        returncode, out, err, why = await _supervise(proc, stdin, limits)
        wall = time.monotonic() - start
        status = _read_status(status_r)
    finally:
        os.close(status_r)
    if "child-pid" not in status:
        message = err.data.decode("utf-8", "replace").strip()
        raise SandboxError(f"bubblewrap could not start the sandbox: {message}")
    code = status.get("exit-code", returncode)
    # bubblewrap reports a child killed by signal N as exit status 128 + N.
    sig = code - 128 if 128 < code < 128 + 65 else None
    return _result(
        code if sig is None else None, sig, out=out, err=err, why=why, wall=wall, isolated=True
    )


async def _run_unisolated(
    source: bytes, stdin: bytes, limits: SandboxLimits, run_id: str
) -> ExecutionResult:
    with tempfile.TemporaryDirectory(prefix="rl-envs-unsafe-") as tmp:
        path = os.path.join(tmp, "main.py")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            _write_all(fd, source)
        finally:
            os.close(fd)
        start = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *interpreter_args(limits, run_id, path),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            cwd=tmp,
            env=environment(sys.executable, tmp),
        )
        returncode, out, err, why = await _supervise(proc, stdin, limits)
        wall = time.monotonic() - start
    sig = -returncode if returncode < 0 else None
    return _result(
        None if sig else returncode, sig, out=out, err=err, why=why, wall=wall, isolated=False
    )


async def _supervise(
    proc: asyncio.subprocess.Process, stdin: bytes, limits: SandboxLimits
) -> tuple[int, _Stream, _Stream, StopReason | None]:
    """Feeds stdin, collects capped output, enforces the wall clock; kills the whole
    process group (and so, through --die-with-parent, the sandbox) when a limit is hit."""
    assert proc.stdin is not None
    assert proc.stdout is not None
    assert proc.stderr is not None
    out, err = _Stream(bytearray()), _Stream(bytearray())
    why: StopReason | None = None

    def kill(reason: StopReason) -> None:
        nonlocal why
        if why is None:
            why = reason
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    async def feed(writer: asyncio.StreamWriter) -> None:
        try:
            if stdin:
                writer.write(stdin)
                await writer.drain()
            writer.close()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the program exited (or stopped reading) before taking all its input

    async def collect(reader: asyncio.StreamReader, into: _Stream) -> None:
        # Reads to EOF even past the cap (dropping the rest), so that the pipe and its
        # transport close with the process.
        while chunk := await reader.read(_READ_CHUNK):
            room = limits.output_bytes - len(into.data)
            if len(chunk) > room:
                into.data += chunk[: max(room, 0)]
                if not into.truncated:
                    into.truncated = True
                    kill("output_limit")
                continue
            into.data += chunk

    work = asyncio.gather(
        feed(proc.stdin), collect(proc.stdout, out), collect(proc.stderr, err), proc.wait()
    )
    try:
        await asyncio.wait_for(asyncio.shield(work), timeout=limits.wall_seconds)
    except TimeoutError:
        kill("timeout")
        try:
            await asyncio.wait_for(asyncio.shield(work), timeout=_REAP_GRACE_S)
        except TimeoutError:
            work.cancel()
            await proc.wait()
    except BaseException:
        kill("timeout")  # cancelled: never leave a sandbox running behind us
        work.cancel()
        raise
    returncode = proc.returncode
    assert returncode is not None
    return returncode, out, err, why


def _result(
    exit_code: int | None,
    sig: int | None,
    *,
    out: _Stream,
    err: _Stream,
    why: StopReason | None,
    wall: float,
    isolated: bool,
) -> ExecutionResult:
    stderr = err.data.decode("utf-8", "replace")
    stopped: StopReason
    if why is not None:
        stopped, exit_code, sig = why, None, signal.SIGKILL
    elif sig is not None:
        stopped = "cpu_limit" if sig == signal.SIGXCPU else "signal"
        if sig == signal.SIGXFSZ:
            stopped = "file_size_limit"
    elif exit_code:
        stopped = _stopped_by_error(stderr)
    else:
        stopped = "exited"
    return ExecutionResult(
        stdout=out.data.decode("utf-8", "replace"),
        stderr=stderr,
        exit_code=exit_code,
        signal=sig,
        stopped=stopped,
        wall_seconds=wall,
        stdout_truncated=out.truncated,
        stderr_truncated=err.truncated,
        isolated=isolated,
    )


def _stopped_by_error(stderr: str) -> StopReason:
    """Which limit a non-zero exit came from, read off the traceback's last line."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if last.startswith("MemoryError"):
        return "memory_limit"
    if "[Errno 27]" in last:  # EFBIG: RLIMIT_FSIZE (CPython ignores SIGXFSZ)
        return "file_size_limit"
    if "[Errno 28]" in last:  # ENOSPC: the private /tmp or /dev/shm is full
        return "disk_full"
    return "exited"


def _check_limits(limits: object) -> SandboxLimits:
    if not isinstance(limits, SandboxLimits):
        raise TypeError(f"limits must be a SandboxLimits, got {type(limits).__name__}")
    return limits


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_status(fd: int) -> dict[str, int]:
    """bubblewrap's --json-status-fd stream: one JSON object per line; merged."""
    chunks = []
    os.set_blocking(fd, False)
    while True:
        try:
            chunk = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    merged: dict[str, int] = {}
    for line in b"".join(chunks).decode("utf-8", "replace").splitlines():
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            merged.update({k: v for k, v in value.items() if isinstance(v, int)})
    return merged


_PROBED: set[Runtime] = set()


def _probe(runtime: Runtime) -> None:
    """One real run per process, so a machine that cannot isolate fails at construction
    with bubblewrap's own error instead of at the first program."""
    if runtime in _PROBED:
        return
    probe = _run_isolated(runtime, b"print('ok')", b"", SandboxLimits(), "rl-envs-probe")
    try:
        result = _run_coroutine(probe)
    except SandboxError as e:
        raise SandboxUnavailableError(
            f"{e} (is creating user namespaces allowed? see sysctl user.max_user_namespaces "
            "and kernel.unprivileged_userns_clone, and AppArmor's "
            "kernel.apparmor_restrict_unprivileged_userns)"
        ) from None
    if result.stdout != "ok\n":
        raise SandboxUnavailableError(
            f"the sandbox's probe run failed ({result.stopped}, exit {result.exit_code}): "
            f"{result.stderr.strip()[-2000:]}"
        )
    _PROBED.add(runtime)


def _run_coroutine(coro: Coroutine[Any, Any, ExecutionResult]) -> ExecutionResult:
    """Runs `coro` to completion from sync code, also when this thread has a running loop
    (an actor's `__init__`): then on a fresh loop in a helper thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        result: ExecutionResult = asyncio.run(coro)
        return result
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


__all__ = ["Sandbox", "SandboxError", "SandboxUnavailableError"]
