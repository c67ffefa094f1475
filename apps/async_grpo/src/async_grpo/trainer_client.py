"""The controller's handle on the trainer, whether it is one process or a sharded mesh.

`trainer.procs == 1`: one `Trainer` actor; weights go out as an `rdma_tensor.Manifest`.
`trainer.procs > 1`: a mesh of `ShardedTrainer` ranks (FSDP over gloo or nccl); every call
goes to the whole mesh, and the ranks' answers are merged here: their `SourceExport`s into
one `ShardedWeights`, their shares of the loss statistics into the batch's.
"""

from __future__ import annotations

from typing import Any

import torch
from monarch.actor import ProcMesh, this_host
from replay_buffer import Episode

from async_grpo.actors.trainer import Trainer, TrainResult
from async_grpo.config import RunConfig
from async_grpo.training import add_stats
from async_grpo.weight_sync import ShardedWeights, WeightUpdate


def _merge(ranks: list[Any]) -> ShardedWeights:
    """`RankWeights` of every rank -> one `ShardedWeights` (exports in rank order)."""
    ranks = sorted(ranks, key=lambda r: r.export.src_rank)
    versions = {r.version for r in ranks}
    if len(versions) != 1:
        raise RuntimeError(f"trainer ranks disagree on the version: {sorted(versions)}")
    return ShardedWeights(ranks[0].version, ranks[0].layouts, tuple(r.export for r in ranks))


class TrainerClient:
    """Calls the trainer actor(s); `sharded` says which of the two kinds `actor` is."""

    def __init__(self, actor: Any, sharded: bool) -> None:
        self.actor, self.sharded = actor, sharded

    async def publish_initial(self) -> WeightUpdate:
        """Version 0, staged for the generators."""
        if not self.sharded:
            update: WeightUpdate = await self.actor.publish_initial.call_one()
            return update
        return _merge(list((await self.actor.publish_initial.call()).values()))

    async def train_step(
        self, episodes: list[Episode], ref_logprobs: list[list[float]] | None
    ) -> TrainResult:
        """One optimizer step on the batch; returns once its weights are staged."""
        if not self.sharded:
            result: TrainResult = await self.actor.train_step.call_one(episodes, ref_logprobs)
            return result
        steps = list((await self.actor.train_step.call(episodes, ref_logprobs)).values())
        return TrainResult(
            version=steps[0].weights.version,
            weights=_merge([s.weights for s in steps]),
            stats=add_stats([s.stats for s in steps]),
            grad_norm=steps[0].grad_norm,
            lr=steps[0].lr,
            train_s=max(s.train_s for s in steps),
            publish_s=max(s.publish_s for s in steps),
        )

    async def synced(self, version: int) -> None:
        """Every generator runs `version`: a sharded trainer may reuse older staging."""
        if self.sharded:
            await self.actor.release.call(version)

    async def full_weights(self) -> dict[str, torch.Tensor]:
        """The current parameters, unsharded, by name."""
        if not self.sharded:
            weights: dict[str, torch.Tensor] = await self.actor.full_weights.call_one()
            return weights
        return dict(next(iter((await self.actor.full_weights.call()).values())))


async def spawn_trainer(cfg: RunConfig, model_path: str, procs: list[ProcMesh]) -> TrainerClient:
    """Spawns the trainer on a mesh of `cfg.trainer.procs` processes (appended to `procs`,
    so the caller stops it even when set-up fails)."""
    n = cfg.trainer.procs
    mesh = this_host().spawn_procs(per_host={"procs": n})
    procs.append(mesh)
    args = (model_path, cfg.trainer, cfg.sampling, cfg.seed, cfg.steps)
    if n == 1:
        return TrainerClient(mesh.spawn("trainer", Trainer, *args), sharded=False)
    # Imported here: the single-process path never pays for torch.distributed's FSDP.
    from monarch.spmd import setup_torch_elastic_env_async  # noqa: PLC0415

    from async_grpo.actors.sharded_trainer import ShardedTrainer  # noqa: PLC0415

    await setup_torch_elastic_env_async(mesh)
    return TrainerClient(mesh.spawn("trainer", ShardedTrainer, *args), sharded=True)
