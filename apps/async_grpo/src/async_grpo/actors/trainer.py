"""The trainer actor (one process): one GRPO step per batch, then publishes the new weights
through `rdma-tensor`."""

from __future__ import annotations

import dataclasses
import time

import torch
from monarch.actor import Actor, endpoint
from rdma_tensor import Manifest, Publisher
from replay_buffer import Episode

from async_grpo.config import SamplingConfig, TrainerConfig
from async_grpo.grpo import LossStats
from async_grpo.model import load_policy, load_tokenizer
from async_grpo.training import grpo_step, learning_rate, make_optimizer, to_rollouts
from async_grpo.weight_sync import WeightUpdate


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """One optimizer step: the new `version`, the `weights` the generators pull it from, the
    loss statistics (the whole batch's), the gradient norm before clipping, the learning
    rate used, and seconds spent computing the step (`train_s`) and staging the weights
    (`publish_s`)."""

    version: int
    weights: WeightUpdate
    stats: LossStats
    grad_norm: float
    lr: float
    train_s: float
    publish_s: float


class Trainer(Actor):
    """Holds the trainable policy, AdamW and the weight `Publisher`. `total_steps` sets the
    learning-rate schedule's length."""

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
        self._model = load_policy(model_path, torch.float32)
        self._model.train(True)
        tokenizer = load_tokenizer(model_path)
        self._vocab, self._pad = len(tokenizer), int(tokenizer.pad_token_id or 0)
        self._cfg, self._sampling, self._total = cfg, sampling, total_steps
        self._opt = make_optimizer(self._model.parameters(), cfg)
        self._publisher = Publisher()
        self._version = 0

    @endpoint
    async def publish_initial(self) -> Manifest:
        """Stages version 0 so generators can start from exactly the trainer's weights."""
        return self._publisher.publish(self._model.state_dict(), self._version)

    @endpoint
    async def train_step(
        self, episodes: list[Episode], ref_logprobs: list[list[float]] | None
    ) -> TrainResult:
        start = time.perf_counter()
        step = grpo_step(
            self._model,
            self._opt,
            to_rollouts(episodes, ref_logprobs),
            cfg=self._cfg,
            sampling=self._sampling,
            vocab_size=self._vocab,
            pad_id=self._pad,
            lr=learning_rate(self._cfg, self._version, self._total),
        )
        self._version += 1
        trained = time.perf_counter()
        manifest = self._publisher.publish(self._model.state_dict(), self._version)
        return TrainResult(
            version=self._version,
            weights=manifest,
            stats=step.loss,
            grad_norm=step.grad_norm,
            lr=step.lr,
            train_s=trained - start,
            publish_s=time.perf_counter() - trained,
        )

    @endpoint
    async def full_weights(self) -> dict[str, torch.Tensor]:
        """The current parameters by name (for checks)."""
        return {n: p.detach().clone() for n, p in self._model.named_parameters()}
