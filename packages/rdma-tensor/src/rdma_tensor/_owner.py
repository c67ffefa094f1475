"""Who owns a piece of shared memory, and whether that owner is still there.

A reader learns that it runs on the owner's machine by comparing `Machine`s (hostname, kernel
boot id and declared machine id; see `rdma_tensor.machine`). Liveness needs no heartbeat:
every owner holds a tiny control file (an anonymous memfd) open; closing the handle closes it,
and the kernel closes it when the process dies. A reader on the same machine stats
`/proc/<pid>/fd/<fd>` (a few microseconds) and compares the inode. Once that fails, "closed"
and "dead" differ by a flag the owner writes into the control file just before closing it:
the reader keeps its own descriptor on the file from its first check, so it can still read
the flag (a killed process never writes it, and a dying one cannot be told from a live one
by its /proc entry alone).
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass

from rdma_tensor.machine import Machine, same_machine, this_machine


@dataclass(frozen=True)
class FdRef:
    """A file descriptor in the owner process, pinned to the file it referred to.

    `dev`/`ino` identify the file, so a descriptor number reused for another file is detected.
    """

    fd: int
    dev: int
    ino: int


@dataclass(frozen=True)
class ProcessRef:
    """A process on a machine; `start_ticks` guards against pid reuse."""

    machine: Machine
    pid: int
    start_ticks: int


@dataclass(frozen=True)
class Owner:
    """The owner of shared memory: its process and its control descriptor."""

    process: ProcessRef
    control: FdRef


class OwnerState(enum.Enum):
    """What a reader on the owner's machine can observe about the owner."""

    OPEN = "open"
    CLOSED = "closed"
    DEAD = "dead"


def _start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat, or None for a missing or zombie process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses; the fields after the last ')' do not.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def this_process() -> ProcessRef:
    pid = os.getpid()
    ticks = _start_ticks(pid)
    return ProcessRef(this_machine(), pid, ticks if ticks is not None else 0)


def is_local(process: ProcessRef) -> bool:
    """Whether `process` runs on this machine (so its memory can be mapped here)."""
    return same_machine(process.machine, this_machine())


def is_this_process(process: ProcessRef) -> bool:
    return is_local(process) and process.pid == os.getpid()


def fd_ref(fd: int) -> FdRef:
    st = os.fstat(fd)
    return FdRef(fd, st.st_dev, st.st_ino)


def fd_matches(process: ProcessRef, ref: FdRef) -> bool:
    """Whether `ref` is still open in `process` and still names the same file."""
    try:
        st = os.stat(f"/proc/{process.pid}/fd/{ref.fd}")
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (ref.dev, ref.ino)


_CLOSED_FLAG = b"\x01"

# This process's own descriptors on other owners' control files (see the module docstring).
_watched: dict[Owner, int] = {}


def _watch(owner: Owner) -> None:
    if owner in _watched:
        return
    for other in [o for o in _watched if not fd_matches(o.process, o.control)]:
        os.close(_watched.pop(other))  # their owners are gone: stop keeping the files alive
    try:
        fd = os.open(f"/proc/{owner.process.pid}/fd/{owner.control.fd}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) == (owner.control.dev, owner.control.ino):
        _watched[owner] = fd
    else:
        os.close(fd)


def owner_state(owner: Owner) -> OwnerState:
    """Open, closed or dead. Only meaningful on the owner's machine (see `is_local`)."""
    if fd_matches(owner.process, owner.control):
        _watch(owner)
        return OwnerState.OPEN
    fd = _watched.pop(owner, None)
    if fd is not None:
        closed = os.pread(fd, 1, 0) == _CLOSED_FLAG
        os.close(fd)
        return OwnerState.CLOSED if closed else OwnerState.DEAD
    # Never seen open from here: the process table is all that is left to go by.
    if _start_ticks(owner.process.pid) == owner.process.start_ticks:
        return OwnerState.CLOSED
    return OwnerState.DEAD


class Control:
    """The owner's side: holds the control descriptor open until `close`."""

    def __init__(self) -> None:
        self._fd: int | None = os.memfd_create("rdma_tensor_control", os.MFD_CLOEXEC)
        self.owner = Owner(this_process(), fd_ref(self._fd))

    @property
    def closed(self) -> bool:
        return self._fd is None

    def close(self) -> None:
        if self._fd is not None:
            os.pwrite(self._fd, _CLOSED_FLAG, 0)
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.close()
