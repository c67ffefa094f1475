"""Any-machine transport: Monarch `RDMABuffer` (ibverbs, or Monarch's TCP fallback).

`RDMABuffer` registers 1-D contiguous memory and lets a reader in any Monarch process copy
the *whole* buffer into local memory. It needs a Monarch actor context (any actor, or the
controller). A read of part of a buffer therefore goes through a whole-buffer bounce.
"""

from __future__ import annotations

import contextlib
import math
import warnings

import torch
from monarch.rdma import RDMABuffer, RDMATcpFallbackWarning


def register(tensor: torch.Tensor, *, quiet: bool) -> RDMABuffer:
    """Registers a contiguous tensor's bytes (CPU or CUDA) as an `RDMABuffer`.

    `quiet` hides Monarch's warning that RDMA falls back to TCP: in auto mode we register
    only in case a reader turns up on another machine, and same-machine readers never use it.
    """
    with warnings.catch_warnings():
        if quiet:
            warnings.simplefilter("ignore", RDMATcpFallbackWarning)
        return RDMABuffer(tensor.detach().reshape(-1).view(torch.uint8))


async def read(buffer: RDMABuffer, dst: torch.Tensor, timeout_s: float) -> None:
    """Copies the whole buffer into `dst`, a contiguous tensor of exactly its byte size."""
    flat = dst.reshape(-1).view(torch.uint8)
    await buffer.read_into(flat, timeout=max(1, math.ceil(timeout_s)))


def drop(buffer: RDMABuffer) -> None:
    """Unregisters the buffer; readers then fail with 'buffer not found'.

    Monarch sends the release eagerly, so the returned future need not be awaited.
    """
    # A process shutting down may have no Monarch context left to send the release from.
    with contextlib.suppress(Exception):
        buffer.drop()
