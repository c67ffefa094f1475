"""How a new policy version reaches the generators: two data contracts, one receiving side.

- One trainer process (`trainer.procs == 1`): the trainer stages its whole state dict with
  `rdma_tensor.Publisher` and sends a `Manifest`; a generator pulls the newest version.
- A sharded trainer (`trainer.procs > 1`): every parameter is a `Shard(0)` DTensor over the
  trainer's processes. Each trainer rank stages its own shards with
  `dtensor_reshard.ShardPublisher` for the plan "trainer layout -> one unsharded copy", and
  the controller gathers the ranks' exports into a `ShardedWeights`. A generator (an
  unsharded replica: a 1-rank mesh holding `Replicate()` tensors) pulls exactly its pieces
  from every rank, into staging buffers, and copies them into its parameters only when every
  piece has arrived, so a failed pull leaves the running weights untouched.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping

import torch
from dtensor_reshard import Layout, PlanCache, SourceExport, pull
from rdma_tensor import Manifest
from torch.distributed.tensor import Replicate


@dataclasses.dataclass(frozen=True)
class ShardedWeights:
    """One policy version held by a sharded trainer.

    `layouts`: every parameter's layout on the trainer mesh (name -> `Layout`, global shape
    and dtype); `exports`: one `SourceExport` per trainer rank, in rank order (each well under
    a kilobyte per tensor: the bytes stay in the trainer processes until pulled).
    """

    version: int
    layouts: dict[str, Layout]
    exports: tuple[SourceExport, ...]


WeightUpdate = Manifest | ShardedWeights


def replicated(layouts: Mapping[str, Layout]) -> dict[str, Layout]:
    """The destination layouts of one unsharded copy: same names, shapes and dtypes, on a
    1-rank mesh with `Replicate()`. Trainer and generators both derive it, so both compute
    the same plan without exchanging it."""
    return {
        name: Layout(src.global_shape, src.dtype, mesh_shape=(1,), placements=(Replicate(),))
        for name, src in layouts.items()
    }


class ReshardReceiver:
    """A generator's side of the sharded path: pulls `ShardedWeights` into `params`.

    `params` are the generator model's parameters by name (the names the trainer's layouts
    use). Staging buffers are allocated once, in the trainer's dtypes, on the parameters'
    device; the copy into `params` casts when the generator runs another dtype.
    """

    def __init__(self, params: Mapping[str, torch.Tensor]) -> None:
        self._params = dict(params)
        self._plans = PlanCache()
        self._staging: dict[str, torch.Tensor] = {}

    def _check(self, layouts: Mapping[str, Layout]) -> None:
        missing = sorted(set(self._params) - set(layouts))
        extra = sorted(set(layouts) - set(self._params))
        if missing or extra:
            raise ValueError(
                f"trainer and generator disagree on parameter names: the trainer lacks "
                f"{missing[:5]}, the generator lacks {extra[:5]}"
            )
        for name, layout in layouts.items():
            if tuple(self._params[name].shape) != layout.global_shape:
                raise ValueError(
                    f"{name}: the trainer's shape is {layout.global_shape}, the generator's "
                    f"{tuple(self._params[name].shape)}"
                )

    async def pull(self, update: ShardedWeights) -> float:
        """Pulls `update` and installs it, all or nothing. Returns the seconds it took."""
        start = time.perf_counter()
        self._check(update.layouts)
        plan = self._plans.get(update.layouts, replicated(update.layouts))
        for name, layout in update.layouts.items():
            buf = self._staging.get(name)
            if buf is None or buf.dtype != layout.dtype:
                device = self._params[name].device
                self._staging[name] = torch.empty(
                    layout.global_shape, dtype=layout.dtype, device=device
                )
        await pull(plan, 0, list(update.exports), self._staging)
        with torch.no_grad():
            for name, param in self._params.items():
                param.copy_(self._staging[name])
        return time.perf_counter() - start
