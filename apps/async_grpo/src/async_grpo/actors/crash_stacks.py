"""What a process of the run writes if it crashes: every thread's Python stack, before it
dies of the signal (`faulthandler`), into a file of the run's crash folder that the
controller reads when it hears of the death (`observability.crashes`).

Imports no torch: an `rl-envs` environment replica, whose factory is wrapped in
`ReportingCrashes`, imports this module and nothing more of the app.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import faulthandler
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

_crash_file: IO[str] | None = None
"""The open file `faulthandler` writes to (it keeps only its descriptor)."""


def report_crashes(folder: str = "", kind: str = "process") -> Path | None:
    """On SIGSEGV, SIGABRT, SIGBUS, SIGFPE or SIGILL, every thread's Python stack is written
    before the process dies (`faulthandler`), and it still dies of that signal. A rank that
    aborts inside a collective or a native library otherwise leaves only `Killed(sig=6)` in
    its supervision event.

    With `folder` the stacks go to `<folder>/<kind>-<pid>.txt`, which the controller reads
    when it hears of the death (`observability.crashes.read_crashes`): a child's stderr is
    its parent's, lost with it when the parent is a test worker that crashed too. The file is
    opened now (a signal handler cannot open one) and removed at a clean exit when empty.
    Where the folder cannot be written (another host's disk, say) they go to stderr.
    Returns the file; None when the stacks go to stderr, or went to a file already."""
    global _crash_file  # noqa: PLW0603
    if _crash_file is not None:  # one file a process: the first actor set up in it names it
        return None
    path = Path(folder) / f"{kind}-{os.getpid()}.txt"
    if folder:
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            _crash_file = path.open("w")
    if _crash_file is None:
        if not faulthandler.is_enabled():
            faulthandler.enable(all_threads=True)
        return None
    faulthandler.enable(file=_crash_file, all_threads=True)
    atexit.register(_close_crash_file, path)
    return path


def _close_crash_file(path: Path) -> None:
    """At a clean exit: stacks to stderr again, and the file gone if nothing was written."""
    global _crash_file  # noqa: PLW0603
    if _crash_file is None:
        return
    faulthandler.enable(all_threads=True)
    _crash_file.close()
    _crash_file = None
    with contextlib.suppress(OSError):
        if path.stat().st_size == 0:
            path.unlink()


@dataclasses.dataclass(frozen=True)
class ReportingCrashes:
    """`factory(**kwargs)`, called in a process that first sets itself to write its stacks
    into `folder` as `kind` (`report_crashes`): how a process whose set-up is not the app's
    (an `rl-envs` environment replica, made from a factory) writes them too. Picklable, and
    this module imports no torch, so the replica does not either."""

    factory: Callable[..., Any]
    folder: str
    kind: str

    def __call__(self, **kwargs: Any) -> Any:
        report_crashes(self.folder, self.kind)
        return self.factory(**kwargs)
