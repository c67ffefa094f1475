"""How an actor's process shares the machine's cores with the run's other processes."""

from __future__ import annotations

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
