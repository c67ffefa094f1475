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
    frame of the project's code in it ("" when none was found), or why there is no dump."""

    pid: int
    path: Path | None
    innermost: str
    problem: str = ""

    def where(self) -> str:
        """The innermost project frame, or why it is not known."""
        if self.innermost:
            return self.innermost
        return self.problem or "no frame of this project's code in its stack"


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
        if py_spy is None:
            reports.append(StuckReport(pid, None, "", "no stack: py-spy is not installed"))
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
            reports.append(
                StuckReport(pid, None, "", f"no stack: py-spy took over {DUMP_TIMEOUT_S:g} s")
            )
            continue
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or ["failed"])[-1]
            reports.append(StuckReport(pid, None, "", f"no stack: py-spy: {why}"))
            continue
        folder = out_dir / STUCK_DIR
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{label}-{pid}-{stamp}.txt"
        path.write_text(done.stdout)
        reports.append(StuckReport(pid, path, innermost_project_frame(done.stdout)))
    return reports


def stuck_line(who: str, call: str, seconds: float, reports: Sequence[StuckReport]) -> str:
    """One line for a stuck process: which, the call it did not answer, and where it was."""
    if not reports:
        return f"[{who} stuck: no answer to `{call}` within {seconds:g} s]"
    first = reports[0]
    saved = f"; stack saved to {first.path}" if first.path is not None else ""
    return (
        f"[{who} stuck: no answer to `{call}` within {seconds:g} s; pid {first.pid} at "
        f"{first.where()}{saved}]"
    )
