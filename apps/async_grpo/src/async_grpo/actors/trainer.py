"""The trainer actor: one rank of the trainer, whether it has one process or several.

With `trainer.procs == 1` the mesh holds one `Trainer` and weights go out through
`rdma-tensor`; with more, every rank holds a shard of each weight (`model/sharding.py`) and
publishes its shards through `dtensor-reshard`. Everything else (the step, its guards, the
version) is `grpo.step.TrainerCore`. Every endpoint is called on the whole mesh: `train_step`
and `full_weights` run collectives when sharded. A trainer given a checkpoint (`restore`)
starts from its weights, optimizer state and version instead of the model's
(`checkpoint.trainer_state`); `save` writes one in the background. With
`trainer.lora.rank > 0` the model carries LoRA adapters (`model.lora`): only they train,
only they are published and checkpointed.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from dtensor_reshard import ShardManifest
from monarch.actor import Actor, endpoint
from monarch.actor.concurrent import concurrent_endpoint
from replay_buffer import Episode
from torch import Tensor

from async_grpo import tracing
from async_grpo.actors._test_hang import maybe_hang
from async_grpo.actors.cores import ProcessSetup, settle_heap, share_cores
from async_grpo.checkpoint.trainer_state import CheckpointWriter, load_trainer_state
from async_grpo.config.schema import SamplingConfig, TrainerConfig
from async_grpo.grpo.loss import LossStats
from async_grpo.grpo.step import TrainerCore
from async_grpo.model.lora import add_adapters, train_adapter_dropout
from async_grpo.model.policy import load_policy, load_tokenizer, torch_device
from async_grpo.model.sharding import shard_model
from async_grpo.weight_sync.update import TrainerPublisher, WeightPart, WeightUpdate


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """One optimizer step: the new `version`; `weights`, a rank's part of that version as
    the rank returns it and the whole update once the controller merged the ranks
    (`TrainerMesh.train_step`); the loss statistics (a rank's share; the whole batch's once
    merged); the gradient norm before clipping; the learning rate used; seconds spent
    computing the step (`train_s`) and staging the weights (`publish_s`)."""

    version: int
    weights: WeightPart | WeightUpdate
    stats: LossStats
    grad_norm: float
    lr: float
    train_s: float
    publish_s: float

    @property
    def update(self) -> WeightUpdate:
        """The version as every generator pulls it (only once merged)."""
        if isinstance(self.weights, ShardManifest):
            raise TypeError("this is one rank's part of the weights: merge the ranks first")
        return self.weights


class Trainer(Actor):
    """Loads the policy from `model_path`, shards it when `cfg.procs > 1`, and trains it.
    `total_steps` sets the learning-rate schedule's length; `restore`, a trainer checkpoint
    directory, the state to start from (written with any number of ranks)."""

    def __init__(
        self,
        model_path: str,
        cfg: TrainerConfig,
        sampling: SamplingConfig,
        seed: int,
        total_steps: int,
        *,
        restore: str | None = None,
        device: str = "auto",
        setup: ProcessSetup | None = None,
    ) -> None:
        # At the run's own priority (`setup.nice` 0): the loop waits on this process.
        share_cores(setup, "trainer")
        torch.manual_seed(seed)
        model = load_policy(model_path, torch.float32)
        sharded = cfg.sharded
        if cfg.lora.enabled and sharded:
            raise ValueError("trainer.lora: LoRA runs on one trainer process")
        # B starts at zero: version 0 computes the base model's outputs whatever A is, so a
        # generator's own random A is harmless until its first pull replaces it.
        adapter = add_adapters(model, cfg.lora) if cfg.lora.enabled else None
        on = torch_device(device)
        if sharded:
            rank, world = shard_model(model, on)
        else:
            rank, world = 0, 1
            model.to(on)  # type: ignore[arg-type]
        tracing.start_from_env("trainer", index=rank)
        tokenizer = load_tokenizer(model_path)
        self._core = TrainerCore(
            model,
            cfg,
            sampling,
            vocab_size=len(tokenizer),
            pad_id=int(tokenizer.pad_token_id or 0),
            total_steps=total_steps,
            rank=rank,
            world_size=world,
        )
        if adapter is not None and cfg.lora.dropout > 0:
            train_adapter_dropout(model)
        if restore is not None:
            load_trainer_state(self._core, Path(restore), sharded)
        self._publisher = TrainerPublisher(model, rank, sharded, adapter)
        self._writer = CheckpointWriter(sharded, gpu=on.type == "cuda")
        self._core.before_update = self._writer.staged
        settle_heap()

    @endpoint
    async def pid(self) -> int:
        """This rank's process id (for the run's process table)."""
        return os.getpid()

    @endpoint
    async def publish_initial(self) -> WeightPart:
        """Stages the version the trainer starts from (0, or a restored checkpoint's) so the
        generators start from exactly its weights."""
        return self._publisher.publish(self._core.version)

    @endpoint
    async def train_step(
        self, episodes: Sequence[Episode], ref_logprobs: Tensor | None
    ) -> TrainResult:
        """One step on this rank's share of the batch, then the new version staged."""
        maybe_hang("trainer", "train_step")
        start = time.perf_counter()
        with tracing.span(
            "train_step", version=self._core.version + 1, episodes=len(episodes)
        ) as span:
            step = self._core.step(episodes, ref_logprobs)
            span.set(rows=step.rows)
        trained = time.perf_counter()
        with tracing.span("publish", version=self._core.version):
            weights = self._publisher.publish(self._core.version)
        return TrainResult(
            version=self._core.version,
            weights=weights,
            stats=step.loss,
            grad_norm=step.grad_norm,
            lr=step.lr,
            train_s=trained - start,
            publish_s=time.perf_counter() - trained,
        )

    @endpoint
    async def release(self, version: int) -> None:
        """Every generator runs `version` or newer: older staging may be reused."""
        self._publisher.release(version)

    @endpoint
    async def save(self, path: str) -> float:
        """Starts writing the current state into the checkpoint directory `path` and returns
        once it is staged: the seconds training was held."""
        with tracing.span("checkpoint", version=self._core.version) as s:
            held = self._writer.start(self._core, Path(path))
            s.set(held_s=held)
        return held

    # Concurrent: it waits for the background write while train steps go on.
    @concurrent_endpoint
    async def saved(self) -> None:
        """Returns once the last `save` is written (raises what the write raised)."""
        await self._writer.wait()

    @endpoint
    async def full_weights(self) -> dict[str, Tensor]:
        """Every parameter, unsharded, on CPU (a collective when sharded)."""
        return {
            n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu().clone()
            for n, p in self._core.model.named_parameters()
        }
