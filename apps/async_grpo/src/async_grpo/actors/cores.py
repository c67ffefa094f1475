"""How a run's process shares the machine with the run's other processes: its cores, and
its pauses for the garbage collector."""

from __future__ import annotations

import atexit
import gc
import os
from pathlib import Path

import torch


def share_cores(nice: int = 0) -> None:
    """One torch thread: the run's processes share the cores, and a process with more
    threads than its share only makes them wait for one another. With `nice` > 0 every
    thread of this process yields its core to the run's other processes when both could
    run (`lower_priority`)."""
    torch.set_num_threads(1)
    lower_priority(nice)


def lower_priority(nice: int) -> int:
    """Adds `nice` (capped at 19) to the scheduling priority of every thread of this process,
    those already running included (Linux sets it per thread, and a new thread inherits its
    creator's, so this covers the threads to come too); returns the threads changed, 0 where
    there is no `/proc/self/task` (not Linux)."""
    tasks = Path("/proc/self/task")
    if nice == 0 or not tasks.is_dir():
        return 0
    changed = 0
    for tid in (int(t.name) for t in tasks.iterdir()):
        try:
            now = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, min(19, now + nice))
        except ProcessLookupError:
            continue  # the thread ended meanwhile
        changed += 1
    return changed


def settle_heap() -> None:
    """Takes every object alive now out of the garbage collector's full passes
    (`gc.freeze`); called once a process is set up. A full pass visits every tracked object,
    and a process holding torch and transformers has several hundred thousand: 150-850 ms a
    pass on the 2-core machine, about one a 300-step run after set-up, and any of the run's
    processes stopping stalls the loop. Afterwards a pass visits only what was made
    since. Reference counting still frees frozen objects; only a cycle among them that
    becomes garbage later is kept. They are unfrozen at exit (`release_heap`)."""
    gc.freeze()
    atexit.unregister(release_heap)  # once, however often a process settles
    atexit.register(release_heap)


def release_heap() -> None:
    """Undoes `settle_heap` (`gc.unfreeze`) in a process that goes on after its run: what
    was frozen is collected as usual again, and nothing of it is left uncollected at exit
    (where native bindings report such objects as leaks)."""
    gc.unfreeze()
