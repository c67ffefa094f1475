"""A new policy version as CPU tensors in the trainer's names, for an engine to load itself.

The `hf` engine pulls straight into its model's parameters (`weight_sync.update.pull`). An
inference engine keeps its weights in its own layout (fused, sharded, repacked for its
kernels), so it loads a version from a checkpoint-format state dict instead; this module
gets that state dict with the fewest copies the transport allows:

- `rdma_tensor` on the trainer's machine: nothing is copied. The tensors are read-only views
  of the publisher's staging memory (a `Subscriber` in "auto" mode maps it), leased until
  the last view is dropped, so the engine reads the bytes once, while loading them;
- `rdma_tensor` from another machine: one copy (RDMA) into fresh CPU tensors;
- `dtensor_reshard` (a sharded trainer): one copy of exactly the overlapping slices from
  every rank into CPU tensors kept from one version to the next.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping

import dtensor_reshard
import torch
from dtensor_reshard import ShardedManifest
from rdma_tensor import Manifest, Subscriber
from torch import Tensor

from async_grpo.weight_sync.update import WeightUpdate, transports


@dataclasses.dataclass(frozen=True)
class StagedWeights:
    """One complete version, staged on CPU.

    `tensors`: name -> tensor in the trainer's names, shapes and dtypes (checkpoint format);
    read-only views of the publisher's memory when `mapped`, so never write to them, and
    drop them once loaded (they pin the publisher's slot). `seconds`: wall time of the pull;
    `nbytes`: bytes of tensor data; `transport`: how they came (`weight_sync.WeightSync`).
    """

    version: int
    tensors: Mapping[str, Tensor]
    seconds: float
    nbytes: int
    mapped: bool
    transport: str = ""


def _module_of(entries: Mapping[str, tuple[tuple[int, ...], torch.dtype]]) -> torch.nn.Module:
    """A bare module tree whose parameters are named `entries` (dots make submodules)."""
    root = torch.nn.Module()
    for name, (shape, dtype) in entries.items():
        *path, leaf = name.split(".")
        module = root
        for part in path:
            child = getattr(module, part, None)
            if not isinstance(child, torch.nn.Module):
                child = torch.nn.Module()
                module.add_module(part, child)
            module = child
        # Untouched memory costs nothing: mapping re-points these before they are written.
        empty = torch.empty(shape, dtype=dtype)
        module.register_parameter(leaf, torch.nn.Parameter(empty, requires_grad=False))
    return root


class Stager:
    """Pulls versions for one engine; keeps the sharded path's buffers between versions."""

    def __init__(self) -> None:
        self._sharded: dict[str, Tensor] = {}

    async def pull(self, update: WeightUpdate) -> StagedWeights:
        """The newest staged version >= `update.version`, whole (all or nothing)."""
        start = time.perf_counter()
        if isinstance(update, ShardedManifest):
            shapes = {n: (tuple(la.global_shape), la.dtype) for n, la in update.layouts.items()}
            if {n: (tuple(t.shape), t.dtype) for n, t in self._sharded.items()} != shapes:
                self._sharded = {n: torch.empty(s, dtype=d) for n, (s, d) in shapes.items()}
            result = await dtensor_reshard.pull(update, into=self._sharded)
            seconds = time.perf_counter() - start
            how = transports(result.transports)
            return StagedWeights(result.version, self._sharded, seconds, result.nbytes, False, how)
        if not isinstance(update, Manifest):
            raise TypeError(f"not a weight update: {type(update).__name__}")
        entries = {e.name: (tuple(e.shape), e.dtype) for e in update.bucket_layout.entries}
        module = _module_of(entries)
        # A fresh subscriber each time: the engine keeps the version, and the views of this
        # one die with `tensors` once the engine has loaded them, releasing the slot's lease.
        pulled = await Subscriber(module, mode="auto").pull(update)
        tensors = {name: module.get_parameter(name).detach() for name in entries}
        seconds = time.perf_counter() - start
        how = pulled.transport.value
        return StagedWeights(pulled.version, tensors, seconds, pulled.nbytes, pulled.mapped, how)
