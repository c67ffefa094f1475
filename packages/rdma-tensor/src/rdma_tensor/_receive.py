"""Where RDMA pulls land: receive buffers shaped like a staging slot's buckets, kept across
pulls by each `Subscriber`.

Why keep them: the first write to a fresh page faults, and an RDMA read into fresh memory
pays for it (allocating and touching 256 MB took 123 ms on the development machine, where
the transfer itself took about 300 ms), so a subscriber reuses its buffers.

A buffer is in use from the moment a pull takes it until either

- copy: the verified version has been copied into the destination (right after the
  transfer), or
- adopt: the last tensor viewing it is freed. A subscriber in mode "auto" whose destination
  is a CPU `nn.Module` with the published dtypes is re-pointed to views of the buffer
  (`tensor.data = view`), as map mode re-points it to the staging slot on the publisher's
  machine: nothing is copied after the transfer. The views' storage is created
  (`torch.frombuffer`) over a small ctypes object whose finalizer gives the buffer back, as
  `_lease` does for leases, so a pull never receives into a buffer while any view of it
  lives: a caller that keeps an old weight keeps its values, and the pull takes another
  buffer instead. With one version in use and one arriving, that is two buffers.
"""

from __future__ import annotations

import ctypes
import weakref
from functools import cache
from typing import Any

import torch

from rdma_tensor.manifest import BucketLayout

MAX_FREE = 2  # free buffers a pool keeps (more would only hold memory)


class ReceivePool:
    """One subscriber's receive buffers, for the bucket layout it last pulled."""

    def __init__(self) -> None:
        self._sizes: tuple[int, ...] = ()
        self._free: list[torch.Tensor] = []

    def take(self, layout: BucketLayout) -> torch.Tensor:
        """A flat uint8 buffer of `layout.total_nbytes`, reused when one is free."""
        if layout.bucket_nbytes != self._sizes:  # another publisher's layout: start over
            self._sizes, self._free = layout.bucket_nbytes, []
        if self._free:
            return self._free.pop()
        return torch.empty(layout.total_nbytes, dtype=torch.uint8)

    def give_back(self, buffer: torch.Tensor, sizes: tuple[int, ...]) -> None:
        """Returns a buffer nothing uses any more (dropped if the layout changed since)."""
        if sizes == self._sizes and len(self._free) < MAX_FREE:
            self._free.append(buffer)

    @property
    def free(self) -> int:
        """Free buffers held (for tests)."""
        return len(self._free)


def buckets(buffer: torch.Tensor, layout: BucketLayout) -> list[torch.Tensor]:
    """The buffer split into one view per bucket, in order."""
    return list(torch.split(buffer, list(layout.bucket_nbytes)))


def _give_back(holder: Any) -> None:
    state = holder.__dict__
    pool = state.pop("pool", lambda: None)()
    buffer = state.pop("buffer", None)
    if pool is not None and buffer is not None:
        pool.give_back(buffer, state["sizes"])


@cache
def _holder_type(nbytes: int) -> type[ctypes.Array[ctypes.c_char]]:
    """A ctypes byte array type whose instances give their buffer back when collected."""
    base = ctypes.c_char * nbytes
    return type("ReceivedBytes", (base,), {"__del__": _give_back})


def adopt(pool: ReceivePool, buffer: torch.Tensor, layout: BucketLayout) -> list[torch.Tensor]:
    """Views of `buffer`'s buckets for a destination to run on; `buffer` goes back to `pool`
    when the last tensor viewing them is freed (never earlier)."""
    holder = _holder_type(buffer.numel()).from_address(buffer.data_ptr())
    holder.__dict__.update(buffer=buffer, pool=weakref.ref(pool), sizes=layout.bucket_nbytes)
    return buckets(torch.frombuffer(holder, dtype=torch.uint8), layout)
