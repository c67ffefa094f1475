"""Same-machine CUDA transport: the reader opens the owner's allocation by CUDA IPC handle.

We reuse torch's own IPC protocol (`torch.multiprocessing.reductions.reduce_tensor`): it
exports the allocation's `cudaIpcMemHandle`, keeps the owner's block alive while readers hold
it (a shared reference count), and records an event the reader waits on before first use.
Opening a handle costs milliseconds, so readers cache the opened tensor per owner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

from rdma_tensor._owner import FdRef, ProcessRef


@dataclass(frozen=True)
class CudaIpcRef:
    """What `reduce_tensor` produced for a contiguous CUDA tensor (picklable)."""

    rebuild_args: tuple[Any, ...]


def export_cuda(tensor: torch.Tensor) -> CudaIpcRef:
    _, args = reduce_tensor(tensor.detach())  # type: ignore[no-untyped-call]
    return CudaIpcRef(tuple(args))


_opened: dict[tuple[ProcessRef, FdRef], torch.Tensor] = {}


def open_cuda(owner: ProcessRef, control: FdRef, ref: CudaIpcRef) -> torch.Tensor:
    """The owner's tensor, opened in this process (cached per owner handle)."""
    key = (owner, control)
    tensor = _opened.get(key)
    if tensor is None:
        tensor = _opened[key] = rebuild_cuda_tensor(*ref.rebuild_args)  # type: ignore[no-untyped-call]
    return tensor


def forget(owner: ProcessRef) -> None:
    """Drops opened tensors of `owner`, letting the owner free its blocks."""
    for key in [k for k in _opened if k[0] == owner]:
        del _opened[key]
