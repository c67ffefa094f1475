"""Same-machine CPU transport: the reader maps the owner's shared-memory file.

Owner side: torch moves a storage into an *unlinked* shared-memory file and keeps its
descriptor open (`UntypedStorage._share_fd_cpu_`, the mechanism behind
`torch.multiprocessing`). Nothing is ever named in /dev/shm, so nothing can leak, not even
after SIGKILL: the kernel frees the memory once the last descriptor and mapping are gone.

Reader side: `open("/proc/<pid>/fd/<fd>")` yields the same file; we map it read-only with
MAP_POPULATE and cache the mapping, so repeated reads pay neither `mmap` nor page faults.
A reader that copies into CUDA memory maps it read-write instead and page-locks it for CUDA
once (`cudaHostRegister`), so its host-to-device copies are DMA from the mapping itself: on
the first GPU run (one H200) a pull of 1.26 GB from an unregistered mapping ran at 6.7 GB/s,
the driver's pageable path, against 55 GB/s for a page-locked device-to-host copy. It never
writes through that mapping; CUDA cannot page-lock a read-only one without a flag not every
system supports.
The same descriptor carries the short `flock` leases of copying readers (see `staging.py`);
a mapping reader's lease gets a descriptor of its own, owned by its views (`lease`, see
`_lease`). The kernel drops a lease when its holder dies.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import warnings
from collections.abc import Collection
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import torch

from rdma_tensor import _lease
from rdma_tensor._owner import FdRef, ProcessRef, fd_matches, fd_ref
from rdma_tensor.errors import PublisherDiedError, TransportError


@dataclass(frozen=True)
class ShmRegion:
    """`nbytes` bytes at `byte_offset` of a shared-memory file of `file_nbytes` bytes."""

    file: FdRef
    file_nbytes: int
    byte_offset: int
    nbytes: int


def export_cpu(tensor: torch.Tensor) -> ShmRegion:
    """Moves `tensor`'s storage into shared memory in place (no-op if it already is there).

    Every view of the storage follows the move, as with `Tensor.share_memory_()`.
    """
    fd, size = tensor.untyped_storage()._share_fd_cpu_()
    return ShmRegion(
        file=fd_ref(fd),
        file_nbytes=size,
        byte_offset=int(tensor.storage_offset()) * tensor.element_size(),
        nbytes=tensor.numel() * tensor.element_size(),
    )


def new_segment(nbytes: int) -> torch.Tensor:
    """A zero-filled 1-D uint8 tensor in shared memory; zeroing faults every page in now."""
    storage = torch.UntypedStorage._new_using_fd_cpu(nbytes)
    segment = torch.empty(0, dtype=torch.uint8).set_(storage)
    segment.zero_()
    return segment


class _Mapping:
    def __init__(self, fd: int, mm: mmap.mmap, data: torch.Tensor, *, for_cuda: bool) -> None:
        self.fd = fd
        self.mm = mm
        self.data = data
        self.for_cuda = for_cuda
        self.cuda_registered = False
        if for_cuda:
            err = _cudart().cudaHostRegister(data.data_ptr(), data.numel(), 0)
            self.cuda_registered = int(err) == 0  # if refused, copies take the pageable path

    def release(self) -> None:
        if self.cuda_registered:
            with suppress(Exception):
                _cudart().cudaHostUnregister(self.data.data_ptr())
            self.cuda_registered = False
        # Dropping the tensor and the mmap object unmaps; the memory is freed once the owner
        # has let go as well.
        del self.data
        del self.mm
        os.close(self.fd)


_mappings: dict[tuple[ProcessRef, FdRef, bool], _Mapping] = {}
"""Open mappings by owner, file and whether they are page-locked for CUDA."""


def _sweep() -> None:
    """Releases mappings whose owner closed the file or died, so their memory can go."""
    for key in [k for k in _mappings if not fd_matches(k[0], k[1])]:
        _mappings.pop(key).release()


def _open(owner: ProcessRef, region: ShmRegion, *, for_cuda: bool) -> _Mapping:
    path = f"/proc/{owner.pid}/fd/{region.file.fd}"
    try:
        fd = os.open(path, (os.O_RDWR if for_cuda else os.O_RDONLY) | os.O_CLOEXEC)
    except FileNotFoundError:
        raise PublisherDiedError(
            f"shared memory of pid {owner.pid} is gone ({path} does not exist): "
            "the owner closed it or died"
        ) from None
    except PermissionError as e:
        raise TransportError(
            f"cannot open {path} ({e}); this kernel forbids mapping another process's "
            "memory; force RDMA with RDMA_TENSOR_TRANSPORT=rdma"
        ) from None
    opened = fd_ref(fd)
    if (opened.dev, opened.ino) != (region.file.dev, region.file.ino):
        os.close(fd)
        raise PublisherDiedError(f"pid {owner.pid} no longer holds the shared-memory file")
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    prot = mmap.PROT_READ | (mmap.PROT_WRITE if for_cuda else 0)
    mm = mmap.mmap(fd, region.file_nbytes, flags=flags, prot=prot)
    with warnings.catch_warnings():
        # Read-only by construction; torch warns that it cannot mark the tensor read-only.
        warnings.simplefilter("ignore", UserWarning)
        data = torch.frombuffer(mm, dtype=torch.uint8)
    return _Mapping(fd, mm, data, for_cuda=for_cuda)


def _mapping(owner: ProcessRef, region: ShmRegion, *, for_cuda: bool = False) -> _Mapping:
    # A file may be mapped twice in one process, for CUDA and not: releasing the first on
    # the second's arrival would close the descriptor another pull's lease may be holding.
    key = (owner, region.file, for_cuda)
    mapping = _mappings.get(key)
    if mapping is None:
        _sweep()
        mapping = _mappings[key] = _open(owner, region, for_cuda=for_cuda)
    return mapping


def local_view(
    owner: ProcessRef, region: ShmRegion, *, for_cuda: bool = False
) -> tuple[torch.Tensor, int]:
    """A uint8 view of `region` in this process, and the descriptor for leases. `for_cuda`:
    the view is page-locked for CUDA copies where CUDA allows (see the module's docstring);
    the caller only reads it either way."""
    mapping = _mapping(owner, region, for_cuda=for_cuda)
    view = mapping.data[region.byte_offset : region.byte_offset + region.nbytes]
    return view, mapping.fd


def lease(owner: ProcessRef, region: ShmRegion) -> torch.Tensor | None:
    """A read-only uint8 view of `region` that holds a shared `flock` lease on its file for
    as long as it, or any tensor viewing its memory, is alive; None if an exclusive lock
    (a publisher rewriting the file) is held. See `_lease`."""
    mapping = _mapping(owner, region)
    # A descriptor of our own (a new open file description), so this lease is independent
    # of every other lease and of the short copy leases taken on `mapping.fd`.
    fd = os.open(f"/proc/self/fd/{mapping.fd}", os.O_RDONLY | os.O_CLOEXEC)
    if not try_lock(fd, exclusive=False):
        os.close(fd)
        return None
    address = mapping.data.data_ptr() + region.byte_offset
    return _lease.leased_tensor(address, region.nbytes, fd, keep=mapping.mm, file=region.file)


def forget(owner: ProcessRef) -> None:
    """Releases every mapping of `owner` (after it closed or died)."""
    for key in [k for k in _mappings if k[0] == owner]:
        _mappings.pop(key).release()


def mapped_bytes(files: Collection[FdRef] | None = None) -> int:
    """Bytes this process has mapped from other owners (of `files` only, if given), for
    tests and leak checks. Leased views (`lease`) keep their mapping alive after `forget`;
    `_lease.leased_bytes` counts those."""
    return sum(m.data.numel() for k, m in _mappings.items() if files is None or k[1] in files)


def cuda_registered_bytes() -> int:
    """Bytes of this process's mappings page-locked for CUDA, for tests and benchmarks."""
    return sum(m.data.numel() for m in _mappings.values() if m.cuda_registered)


def _cudart() -> Any:
    return torch.cuda.cudart()  # type: ignore[no-untyped-call]


def try_lock(fd: int, *, exclusive: bool) -> bool:
    """A non-blocking `flock`; False if a conflicting lock is held."""
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def unlock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)
