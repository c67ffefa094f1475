"""Leased views: tensors whose memory pins a staging slot for exactly as long as they live.

A same-machine reader that *maps* a version (instead of copying it) runs on the publisher's
staging memory, so the publisher must not rewrite that slot while any tensor still points
into it, however the reader's code passes those tensors around. The lease is therefore tied
to the tensor storage itself, not to an object the caller has to remember to close:

- the lease is a shared `flock` on a descriptor of its own (the publisher's claim is an
  exclusive, non-blocking `flock`, so it skips a leased slot);
- the storage is created by `torch.frombuffer` over a small ctypes object that owns that
  descriptor. torch keeps a reference to the buffer object until the storage is freed, so
  the object's `__del__` (which closes the descriptor and so ends the lease) runs exactly
  when the last tensor viewing the memory is gone, never earlier;
- the object also keeps the `mmap` alive: a dropped mapping cache (owner closed or died)
  cannot unmap memory a leased view still uses.

The mapping is read-only (`PROT_READ`), so a write through a leased view kills the process
with SIGSEGV rather than corrupting the publisher's memory or a later version.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Collection
from functools import cache
from typing import Any

import torch

from rdma_tensor._owner import FdRef

_live: dict[int, tuple[int, FdRef]] = {}  # id of each live lease object -> (bytes, file)


def leased_bytes(files: Collection[FdRef] | None = None) -> int:
    """Bytes of staging memory this process's live leased views pin (in `files` only, if
    given: the owner's `FdRef`s; for tests and leak checks)."""
    return sum(n for n, file in _live.values() if files is None or file in files)


def _release(holder: Any, _close: Any = os.close, _live: dict[int, Any] = _live) -> None:
    # Defaults bind what it needs: at interpreter exit module globals may be gone already.
    fd = holder.__dict__.pop("fd", None)
    if fd is not None:
        _close(fd)  # ends the flock lease: the publisher may claim the slot again
        _live.pop(id(holder), None)


@cache
def _holder_type(nbytes: int) -> type[ctypes.Array[ctypes.c_char]]:
    """A ctypes byte array type of `nbytes` bytes whose instances end their lease on GC."""
    base = ctypes.c_char * nbytes
    return type("LeasedBytes", (base,), {"__del__": _release})


def leased_tensor(address: int, nbytes: int, fd: int, *, keep: object, file: FdRef) -> torch.Tensor:
    """A uint8 tensor over `nbytes` bytes at `address`; its storage owns `fd` (closed when
    the storage is freed) and keeps `keep` (the mapping) alive. `fd` must hold the lease."""
    holder = _holder_type(nbytes).from_address(address)
    holder.__dict__.update(fd=fd, keep=keep)
    _live[id(holder)] = (nbytes, file)
    return torch.frombuffer(holder, dtype=torch.uint8)
