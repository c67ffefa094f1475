"""How a run's process shares the machine with the run's other processes: its cores, the
memory it frees, and its pauses for the garbage collector; and what it says if it crashes."""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import dataclasses
import gc
import os
import sys
from pathlib import Path

import torch

from async_grpo.actors.crash_stacks import report_crashes


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity where the OS keeps one (`taskset`, a
    container's cpuset), else every CPU the machine has. `os.cpu_count()` counts the
    machine's, which a process confined to fewer cannot use."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@dataclasses.dataclass(frozen=True)
class ProcessSetup:
    """How one of the run's processes is set up beside the others (`share_cores`): every
    actor's constructor takes one."""

    nice: int = 0
    """Added to the process's scheduling priority; > 0 yields its cores to the run's other
    processes when both could run (`lower_priority`)."""
    crash_dir: str = ""
    """Where a crash's stacks go (`report_crashes`); "" sends them to stderr."""


def share_cores(setup: ProcessSetup | None = None, kind: str = "process") -> None:
    """One torch thread: the run's processes share the cores, and a process with more
    threads than its share only makes them wait for one another. With `setup.nice` > 0
    every thread of this process yields its core to the run's other processes when both
    could run (`lower_priority`). A crash of the process writes its threads' Python stacks
    first (`report_crashes`), into `setup.crash_dir` as `<kind>-<pid>.txt`. No `setup`: nice
    0, stacks to stderr."""
    setup = setup if setup is not None else ProcessSetup()
    torch.set_num_threads(1)
    lower_priority(setup.nice)
    report_crashes(setup.crash_dir, kind)


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
    """Called once a process is set up: keeps the memory it frees for its own reuse
    (`keep_freed_memory`) and takes every object alive now out of the garbage collector's
    full passes (`gc.freeze`).

    A full pass visits every tracked object, and a process holding torch and transformers
    has several hundred thousand: 150-850 ms a pass on the 2-core machine, about one a
    300-step run after set-up, and any of the run's processes stopping stalls the loop.
    Afterwards a pass visits only what was made since. Reference counting still frees
    frozen objects; only a cycle among them that becomes garbage later is kept. They are
    unfrozen at exit (`release_heap`)."""
    keep_freed_memory()
    gc.freeze()
    atexit.unregister(release_heap)  # once, however often a process settles
    atexit.register(release_heap)


# glibc's mallopt(3) parameters.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
KEPT_BLOCK_BYTES = 32 << 20
"""A freed block up to this size stays in the process for the next allocation."""
KEPT_TOP_BYTES = 256 << 20
"""Free memory at the top of the heap is handed back to the OS only beyond this."""


def keep_freed_memory() -> bool:
    """Makes glibc's malloc keep freed memory for reuse instead of handing it back to the
    OS; returns whether it could (False off Linux or off glibc).

    By default glibc maps a block of a few hundred KiB on its own and unmaps it when freed,
    and shrinks the heap whenever its free top grows past a threshold. A train step frees
    and allocates the same activations every step, so each step touched fresh pages
    again: about 1,400 page faults a step in the tiny preset's trainer, 3.7 ms of its step
    in the kernel (measured with `getrusage`), each fault a trip into the kernel for a
    zeroed page. With blocks up to `KEPT_BLOCK_BYTES` from the heap and its top kept up to
    `KEPT_TOP_BYTES` the faults stop after the first steps; what a process holds at its
    peak stays held."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # no libc found, or one without mallopt (not glibc)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    # mallopt returns 1 on success; both are set, as setting either fixes the other at its
    # default (glibc stops adapting the thresholds once one is set).
    return bool(mallopt(_M_MMAP_THRESHOLD, KEPT_BLOCK_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, KEPT_TOP_BYTES)
    )


def release_heap() -> None:
    """Undoes `settle_heap` (`gc.unfreeze`) in a process that goes on after its run: what
    was frozen is collected as usual again, and nothing of it is left uncollected at exit
    (where native bindings report such objects as leaks)."""
    gc.unfreeze()
