"""The trainer actor: one GRPO step per batch, then publishes the new weights."""

from __future__ import annotations

import dataclasses
import time

import torch
from monarch.actor import Actor, endpoint
from rdma_tensor import Manifest, Publisher
from replay_buffer import Episode

from async_grpo.batching import Rollout, pack, sequence_logprobs
from async_grpo.config import SamplingConfig, TrainerConfig
from async_grpo.grpo import LossConfig, LossStats, grpo_loss
from async_grpo.model import load_policy, load_tokenizer


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """One optimizer step: the new `version`, its `manifest` for the generators, the loss
    statistics, the gradient norm before clipping, and seconds spent computing the step
    (`train_s`) and staging the weights (`publish_s`)."""

    version: int
    manifest: Manifest
    stats: LossStats
    grad_norm: float
    train_s: float
    publish_s: float


class Trainer(Actor):
    """Holds the trainable policy, AdamW and the weight `Publisher`."""

    def __init__(
        self, model_path: str, cfg: TrainerConfig, sampling: SamplingConfig, seed: int
    ) -> None:
        torch.set_num_threads(1)
        torch.manual_seed(seed)
        self._model = load_policy(model_path, torch.float32)
        self._model.train(True)
        tokenizer = load_tokenizer(model_path)
        self._vocab, self._pad = len(tokenizer), int(tokenizer.pad_token_id or 0)
        self._cfg, self._sampling = cfg, sampling
        self._loss_cfg = LossConfig(
            clip_eps=cfg.clip_eps,
            importance=cfg.importance,
            truncate_cap=cfg.truncate_cap,
            kl_coef=cfg.kl_coef,
        )
        self._opt = torch.optim.AdamW(
            self._model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay
        )
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
        rollouts = [
            Rollout(
                prompt_ids=e.prompt_ids.tolist(),
                response_ids=e.response_ids.tolist(),
                behaviour_logprobs=e.behavior_logprobs.tolist(),
                advantage=e.advantage,
                ref_logprobs=ref_logprobs[i] if ref_logprobs is not None else None,
            )
            for i, e in enumerate(episodes)
        ]
        batch = pack(rollouts, self._pad)
        lp = sequence_logprobs(
            self._model, batch, self._sampling.temperature, self._sampling.top_p, self._vocab
        )
        loss, stats = grpo_loss(
            lp,
            batch.behaviour_logprobs,
            batch.advantages,
            batch.response_mask,
            self._loss_cfg,
            ref_logprobs=batch.ref_logprobs,
        )
        self._opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        grad_norm = torch.nn.utils.clip_grad_norm_(self._model.parameters(), self._cfg.grad_clip)
        self._opt.step()
        self._version += 1
        trained = time.perf_counter()
        manifest = self._publisher.publish(self._model.state_dict(), self._version)
        return TrainResult(
            version=self._version,
            manifest=manifest,
            stats=stats,
            grad_norm=float(grad_norm),
            train_s=trained - start,
            publish_s=time.perf_counter() - trained,
        )
