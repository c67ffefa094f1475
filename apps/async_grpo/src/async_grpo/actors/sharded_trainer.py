"""The sharded trainer (`trainer.procs > 1`): FSDP-style data parallelism over a process mesh,
weights to the generators through `dtensor-reshard`.

Every process of the trainer's mesh runs one `ShardedTrainer` rank. `torch.distributed`'s
`fully_shard` (FSDP2) turns every parameter into a `Shard(0)` DTensor over the mesh (gloo on
CPU, nccl on GPU): a rank holds 1/procs of each weight and of the AdamW state, the forward
and backward passes gather and reduce-scatter layer by layer. Each rank trains on its own
slice of the batch's groups (see `training.grpo_step` for how the loss is normalised so the
step equals a single process's). After the step each rank stages its own shards with a
`dtensor_reshard.ShardPublisher` for the plan "trainer layout -> one unsharded copy"; the
controller gathers the ranks' `SourceExport`s and every generator pulls exactly the bytes it
needs from every rank, with no gather on the trainer side.

Every endpoint is called on the whole mesh (`train_step` and `full_weights` run
collectives).
"""

from __future__ import annotations

import dataclasses
import os
import time

import torch
import torch.distributed as dist
from dtensor_reshard import Layout, PlanCache, ShardPublisher, SourceExport
from monarch.actor import Actor, endpoint
from replay_buffer import Episode
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from transformers import PreTrainedModel

from async_grpo.config import SamplingConfig, TrainerConfig
from async_grpo.grpo import LossStats
from async_grpo.model import load_policy, load_tokenizer
from async_grpo.training import grpo_step, learning_rate, make_optimizer, rank_slice, to_rollouts
from async_grpo.weight_sync import replicated


@dataclasses.dataclass(frozen=True)
class RankWeights:
    """One rank's share of a version: its `export` and the parameters' `layouts` (the same
    on every rank)."""

    version: int
    export: SourceExport
    layouts: dict[str, Layout]


@dataclasses.dataclass(frozen=True)
class RankStep:
    """One rank's optimizer step: its share of the loss statistics (they add up over the
    ranks), the global gradient norm, the learning rate, its weights, and its timings."""

    weights: RankWeights
    stats: LossStats
    grad_norm: float
    lr: float
    train_s: float
    publish_s: float


def shard_model(model: PreTrainedModel, mesh: DeviceMesh) -> None:
    """FSDP2: each decoder layer is its own unit (gathered only while it computes), then the
    rest (embeddings, final norm, head) as the root unit."""
    inner = getattr(model, "model", None)
    for layer in getattr(inner, "layers", []):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


class ShardedTrainer(Actor):
    """One rank of the sharded trainer. The mesh needs `setup_torch_elastic_env_async` run
    on it before this actor is spawned (it sets the rendezvous environment)."""

    def __init__(
        self,
        model_path: str,
        cfg: TrainerConfig,
        sampling: SamplingConfig,
        seed: int,
        total_steps: int,
    ) -> None:
        torch.set_num_threads(1)
        torch.manual_seed(seed)
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        if not dist.is_initialized():
            dist.init_process_group("nccl" if cuda else "gloo")
        self._rank, self._world = dist.get_rank(), dist.get_world_size()
        mesh = init_device_mesh("cuda" if cuda else "cpu", (self._world,))
        model = load_policy(model_path, torch.float32)
        if cuda:
            model.cuda()  # type: ignore[call-arg]
        model.train(True)
        shard_model(model, mesh)
        self._model = model
        tokenizer = load_tokenizer(model_path)
        self._vocab, self._pad = len(tokenizer), int(tokenizer.pad_token_id or 0)
        self._cfg, self._sampling, self._total = cfg, sampling, total_steps
        self._opt = make_optimizer(model.parameters(), cfg)
        self._params: dict[str, DTensor] = {}
        for name, p in model.named_parameters():
            assert isinstance(p, DTensor), f"{name} was not sharded"
            self._params[name] = p
        self._layouts = {n: Layout.from_dtensor(p) for n, p in self._params.items()}
        self._plan = PlanCache().get(self._layouts, replicated(self._layouts))
        # Staged: each version is a snapshot, so the next step may change the shards while
        # generators still read the previous version.
        self._publisher = ShardPublisher(self._rank, staged=True)
        self._live: dict[int, SourceExport] = {}
        self._version = 0

    def _publish(self) -> RankWeights:
        export = self._publisher.publish(self._plan, self._params)
        self._live[self._version] = export
        return RankWeights(self._version, export, self._layouts)

    @endpoint
    async def publish_initial(self) -> RankWeights:
        """Stages version 0 so generators start from exactly the trainer's weights."""
        return self._publish()

    @endpoint
    async def train_step(
        self, episodes: list[Episode], ref_logprobs: list[list[float]] | None
    ) -> RankStep:
        """Every rank receives the whole batch and trains on its slice of whole groups."""
        start = time.perf_counter()
        rollouts = to_rollouts(episodes, ref_logprobs)
        mine = rank_slice(rollouts, self._sampling.group_size, self._rank, self._world)
        step = grpo_step(
            self._model,
            self._opt,
            mine,
            cfg=self._cfg,
            sampling=self._sampling,
            vocab_size=self._vocab,
            pad_id=self._pad,
            lr=learning_rate(self._cfg, self._version, self._total),
            total_tokens=sum(len(r.response_ids) for r in rollouts),
            world_size=self._world,
        )
        self._version += 1
        trained = time.perf_counter()
        weights = self._publish()
        return RankStep(
            weights=weights,
            stats=step.loss,
            grad_norm=step.grad_norm,
            lr=step.lr,
            train_s=trained - start,
            publish_s=time.perf_counter() - trained,
        )

    @endpoint
    async def release(self, version: int) -> None:
        """Every generator holds `version`: staging buffers of it and older versions are free
        for the next publish."""
        for v in [v for v in self._live if v <= version]:
            self._publisher.release(self._live.pop(v))

    @endpoint
    async def full_weights(self) -> dict[str, torch.Tensor]:
        """Every parameter's `full_tensor()` (a collective: call it on the whole mesh)."""
        return {n: p.full_tensor().detach().cpu() for n, p in self._params.items()}
