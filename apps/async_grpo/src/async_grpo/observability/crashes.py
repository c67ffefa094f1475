"""Where a crashed process was: the stacks it wrote as it died, named when its death is.

Every process of a run writes its threads' Python stacks into `<out_dir>/crashes/` if it
dies of a fatal signal (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL), as `<kind>-<pid>.txt`
(`actors.crash_stacks`, set up with the process). Monarch reports only the signal
(`Killed(sig=6)`), so when the controller hears of a death it looks for the dead processes'
files here (`read_crashes`) and adds where each was to the line it prints (`crash_note`).
A process that ends cleanly removes its empty file; one killed outright (SIGKILL) cannot,
and `remove_empty` clears those at the end of the run. (A process that is stuck rather
than dead: `stuck.py`.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Sequence
from pathlib import Path

from async_grpo.observability.stuck import project_file

CRASH_DIR = "crashes"
# A frame as faulthandler writes it: `  File "path/to/file.py", line 12 in name`.
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<name>\S+)')


@dataclasses.dataclass(frozen=True)
class CrashReport:
    """A process that wrote its stacks as it died: its `pid`, the file, the fatal error
    (`Fatal Python error: Aborted`) and where it was (`innermost_crash_frame`)."""

    pid: int
    path: Path
    error: str
    where: str


def crash_dir(out_dir: str | Path) -> Path:
    """The run's folder of crash stacks."""
    return Path(out_dir) / CRASH_DIR


def innermost_crash_frame(text: str) -> str:
    """Where the thread that crashed was (faulthandler's `Current thread` block, innermost
    frame first): its innermost frame of this project's code, else its innermost frame; ""
    when there is none."""
    blocks = [b for b in text.split("\n\n") if any(map(_FRAME.match, b.splitlines()))]
    current = [b for b in blocks if b.lstrip().startswith("Current thread")]
    first = ""
    for line in (current or blocks or [""])[0].splitlines():
        m = _FRAME.match(line)
        if m is None:
            continue
        where = project_file(m.group("file"))
        frame = f"{m.group('name')} ({where or _library_file(m.group('file'))}:{m.group('line')})"
        if where is not None:
            return frame
        first = first or frame
    return first


def _library_file(path: str) -> str:
    """A file of an installed package from its package on (`torch/distributed/...`), one of
    the standard library from its folder on (`python3.11/selectors.py`)."""
    tail = path.rsplit("site-packages/", maxsplit=1)[-1]
    return "/".join(tail.split("/")[-2:]) if tail.startswith("/") else tail


def read_crash(path: Path) -> CrashReport | None:
    """The stacks in one `<kind>-<pid>.txt`; None when it is empty (the process alive, or
    killed by a signal nothing can catch), unreadable or not such a file: a death is
    handled whether or not its stacks can be read."""
    pid = path.stem.rsplit("-", 1)[-1]
    try:
        text = path.read_text(errors="replace") if pid.isdigit() else ""
    except OSError:
        return None
    if not text.strip():
        return None
    error = next(x for x in text.splitlines() if x.strip()).strip()
    return CrashReport(int(pid), path, error, innermost_crash_frame(text))


def read_crashes(out_dir: str | Path, pids: Sequence[int] | None = None) -> list[CrashReport]:
    """The stacks `pids` (None: every process of the run) wrote as they died, for those
    that wrote any."""
    folder = crash_dir(out_dir)
    patterns = ["*.txt"] if pids is None else [f"*-{pid}.txt" for pid in pids]
    found = (read_crash(path) for pattern in patterns for path in sorted(folder.glob(pattern)))
    return [report for report in found if report is not None]


def crash_note(reports: Sequence[CrashReport]) -> str:
    """`; pid 123 crashed in f (async_grpo/x.py:12) (Fatal Python error: Aborted), stacks in
    <file>` for each report: what follows the death in its line ("" for none)."""
    return "".join(
        f"; pid {r.pid} crashed in {r.where or 'a frame not found'} ({r.error}), stacks in {r.path}"
        for r in reports
    )


def stacks_under(folder: Path) -> list[CrashReport]:
    """Every crash stack file with something in it anywhere under `folder` (the runs of a
    test, say)."""
    found = (read_crash(path) for path in sorted(folder.rglob(f"{CRASH_DIR}/*.txt")))
    return [report for report in found if report is not None]


def remove_empty(out_dir: str | Path) -> None:
    """Removes the empty stack files (processes killed outright, or still running when the
    run ended) and then the folder, if nothing is left in it."""
    folder = crash_dir(out_dir)
    if not folder.is_dir():
        return
    for path in folder.glob("*.txt"):
        with contextlib.suppress(OSError):
            if path.stat().st_size == 0:
                path.unlink()
    with contextlib.suppress(OSError):
        folder.rmdir()  # only when empty
