"""Where a stuck process is stuck: its stack, saved before the process is replaced.

A process can hang while its host still answers for it (a deadlocked endpoint; on GPUs, a
collective that never completes), and then replacing it loses the one clue to why. So
before the controller replaces a process that missed a deadline, `record_stuck` saves a
`py-spy dump` of it (every thread's Python stack, native frames too; py-spy comes with
Monarch) into `<out_dir>/stuck/`, and says in one line which process, which call, and the
innermost frame of this project's code in the dump.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

STUCK_DIR = "stuck"
DUMP_TIMEOUT_S = 20.0
PROJECT_PACKAGES = (
    "async_grpo",
    "rdma_tensor",
    "actor_service",
    "replay_buffer",
    "dtensor_reshard",
    "rl_envs",
)
# A frame as py-spy prints it: "name (path/to/file.py:123)".
_FRAME = re.compile(r"^\s*(?P<name>\S+) \((?P<file>[^():]*\.py):(?P<line>\d+)\)")


def project_file(path: str) -> str | None:
    """`path` from its package on (`async_grpo/actors/trainer.py`) when it is a file of this
    project's code, else None."""
    parts = path.split("/")
    # The last one: a checkout's `apps/async_grpo/src/async_grpo/...` names it twice.
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] in PROJECT_PACKAGES:
            return "/".join(parts[i:])
    return None


@dataclasses.dataclass(frozen=True)
class StuckReport:
    """A stuck process: its `pid`, the dump saved (None when there is none) and the innermost
    frame of the project's code in it ("" when none was found), or why there is no dump; and
    its scheduling `state` before the dump (`process_state`)."""

    pid: int
    path: Path | None
    innermost: str
    problem: str = ""
    state: str = ""

    def where(self) -> str:
        """The innermost project frame, or why it is not known."""
        if self.innermost:
            return self.innermost
        return self.problem or "no frame of this project's code in its stack"

    def describe(self) -> str:
        """`pid 123 at f (async_grpo/x.py:12)`, or `pid 124, stopped: no stack: ...`: the
        state is named when it is neither running nor sleeping, which a hang's usual."""
        state = f", {self.state}" if self.state not in {"", "running", "sleeping"} else ""
        if self.innermost:
            return f"pid {self.pid}{state} at {self.innermost}"
        return f"pid {self.pid}{state}: {self.where()}"


# /proc/<pid>/stat's state letters (proc(5)).
_STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "in an uninterruptible wait (I/O, a driver)",
    "T": "stopped",
    "t": "stopped by a debugger",
    "Z": "a zombie",
    "X": "dead",
}


def process_state(pid: int) -> str:
    """What the kernel says `pid` is doing (`stopped`, `sleeping`, ...); "" when it is
    unknown (no /proc, or the process is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    letter = stat.rsplit(")", 1)[1].split()[0]
    return _STATES.get(letter, letter)


def _py_spy_error(stderr: str) -> str:
    """py-spy's own message (its `Error: ...` line), not the backtrace it may print after."""
    lines = [x.strip() for x in stderr.splitlines() if x.strip()]
    for line in lines:
        if line.startswith("Error:"):
            return line.removeprefix("Error:").strip()
    return lines[-1] if lines else "failed"


def innermost_project_frame(dump: str) -> str:
    """The innermost frame of this project's code in a `py-spy dump` ("" when none). py-spy
    prints each thread innermost first; the thread running an actor's endpoint (Monarch's
    `_Actor.handle` in its stack) is looked at first, since that is the call that hangs, not
    a background thread of ours waiting as it always does."""
    threads = re.split(r"\n(?=Thread )", dump)
    threads.sort(key=lambda block: "_Actor.handle" not in block)  # stable: endpoint first
    for block in threads:
        for line in block.splitlines():
            m = _FRAME.match(line)
            where = project_file(m.group("file")) if m else None
            if m and where is not None:
                return f"{m.group('name')} ({where}:{m.group('line')})"
    return ""


def record_stuck(out_dir: Path, label: str, pids: Sequence[int]) -> list[StuckReport]:
    """Saves a `py-spy dump` of each of `pids` into `<out_dir>/stuck/<label>-<pid>-<time>.txt`
    (blocking, at most `DUMP_TIMEOUT_S` each) and returns what was found."""
    # Next to this Python first: a virtual environment's tools are there even when it was
    # not activated (`.venv/bin/pytest`), and so not on PATH.
    beside = Path(sys.executable).parent / "py-spy"
    py_spy = str(beside) if beside.is_file() else shutil.which("py-spy")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    reports = []
    for pid in pids:
        state = process_state(pid)  # before py-spy pauses it to read it
        if py_spy is None:
            reports.append(StuckReport(pid, None, "", "no stack: py-spy is not installed", state))
            continue
        try:
            done = subprocess.run(
                [py_spy, "dump", "--full-filenames", "--pid", str(pid)],
                capture_output=True,
                text=True,
                timeout=DUMP_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            took = f"no stack: py-spy took over {DUMP_TIMEOUT_S:g} s"
            reports.append(StuckReport(pid, None, "", took, state))
            continue
        if done.returncode != 0:
            why = f"no stack: py-spy: {_py_spy_error(done.stderr)}"
            reports.append(StuckReport(pid, None, "", why, state))
            continue
        folder = out_dir / STUCK_DIR
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{label}-{pid}-{stamp}.txt"
        path.write_text(done.stdout)
        reports.append(StuckReport(pid, path, innermost_project_frame(done.stdout), "", state))
    return reports


def where_stuck(reports: Sequence[StuckReport]) -> str:
    """Where a stuck component's processes were, in a few words: `at f (file:line)` for one
    process; each process described (`StuckReport.describe`) for several, since a rank that
    waits in a collective is not where the hang is."""
    if len(reports) == 1:
        return f"at {reports[0].where()}"
    return "; ".join(r.describe() for r in reports)


def stuck_line(who: str, call: str, seconds: float, reports: Sequence[StuckReport]) -> str:
    """One line for a stuck component: which, the call it did not answer, and where each of
    its processes was. A sharded trainer's ranks wait on each other, so the one that is
    stopped, or whose stack cannot be read, is as much the clue as the frames of the rest."""
    head = f"[{who} stuck: no answer to `{call}` within {seconds:g} s"
    if not reports:
        return head + "]"
    saved = [r.path for r in reports if r.path is not None]
    if len(reports) == 1:
        where = f"; stack saved to {saved[0]}" if saved else ""
    else:
        where = f"; stacks saved in {saved[0].parent}" if saved else ""
    return f"{head}; {'; '.join(r.describe() for r in reports)}{where}]"
