"""One GRPO optimizer step, shared by the single-process trainer and the sharded one.

A data-parallel rank passes only its slice of the batch and the token count of the WHOLE
batch: every token's loss is divided by that global count and the result is multiplied by
the number of ranks, so after FSDP averages the ranks' gradients the step equals the one a
single process would take on the whole batch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

import torch
from replay_buffer import Episode
from transformers import PreTrainedModel

from async_grpo.batching import Rollout, pack, sequence_logprobs_and_entropy
from async_grpo.config import SamplingConfig, TrainerConfig
from async_grpo.grpo import LossConfig, LossStats, grpo_loss


@dataclasses.dataclass(frozen=True)
class StepStats:
    """One optimizer step: loss statistics (this rank's share when data-parallel), the
    gradient norm before clipping (global), and the learning rate used."""

    loss: LossStats
    grad_norm: float
    lr: float


def loss_config(cfg: TrainerConfig) -> LossConfig:
    return LossConfig(
        clip_eps=cfg.clip_eps,
        importance=cfg.importance,
        truncate_cap=cfg.truncate_cap,
        kl_coef=cfg.kl_coef,
        entropy_coef=cfg.entropy_coef,
    )


def make_optimizer(params: Iterable[torch.nn.Parameter], cfg: TrainerConfig) -> torch.optim.AdamW:
    """The one optimizer both trainers use (plain and sharded parameters alike)."""
    return torch.optim.AdamW(
        params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, cfg.adam_beta2)
    )


def learning_rate(cfg: TrainerConfig, step: int, total_steps: int) -> float:
    """The learning rate of optimizer step `step` (0-based) of `total_steps`.

    `lr_schedule="constant"`: `cfg.lr` throughout. `"cosine"`: linear warm-up over
    `warmup_steps`, then a cosine from `cfg.lr` down to `cfg.lr * min_lr_ratio` at the last
    step, where it stays (a run that goes past `total_steps` keeps the floor).
    """
    if cfg.lr_schedule == "constant":
        return cfg.lr
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, total_steps - 1 - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def to_rollouts(
    episodes: Sequence[Episode], ref_logprobs: Sequence[list[float]] | None
) -> list[Rollout]:
    return [
        Rollout(
            prompt_ids=e.prompt_ids.tolist(),
            response_ids=e.response_ids.tolist(),
            behaviour_logprobs=e.behavior_logprobs.tolist(),
            advantage=e.advantage,
            ref_logprobs=ref_logprobs[i] if ref_logprobs is not None else None,
        )
        for i, e in enumerate(episodes)
    ]


def grpo_step(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    rollouts: Sequence[Rollout],
    *,
    cfg: TrainerConfig,
    sampling: SamplingConfig,
    vocab_size: int,
    pad_id: int,
    lr: float,
    total_tokens: int | None = None,
    world_size: int = 1,
) -> StepStats:
    """Computes the GRPO loss on `rollouts`, backpropagates, clips and steps `optimizer`.

    `total_tokens`: the response tokens of the whole batch when `rollouts` is one
    data-parallel rank's slice (None: this is the whole batch); `world_size`: the number of
    ranks whose gradients the sharding wrapper averages.
    """
    batch = pack(rollouts, pad_id).to(next(model.parameters()).device)
    lp, entropy = sequence_logprobs_and_entropy(
        model, batch, sampling.temperature, sampling.top_p, vocab_size
    )
    loss, stats = grpo_loss(
        lp,
        batch.behaviour_logprobs,
        batch.advantages,
        batch.response_mask,
        loss_config(cfg),
        ref_logprobs=batch.ref_logprobs,
        token_count=total_tokens,
        entropy=entropy if cfg.entropy_coef > 0 else entropy.detach(),
    )
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    (loss * world_size).backward()  # type: ignore[no-untyped-call]
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    optimizer.step()
    norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
    return StepStats(stats, float(norm), lr)


def rank_slice(
    rollouts: Sequence[Rollout], group_size: int, rank: int, world_size: int
) -> list[Rollout]:
    """Data-parallel rank `rank`'s share of a batch: a contiguous run of whole groups, the
    groups spread as evenly as `torch.chunk` would. Every rank must get at least one group
    (each runs the same collectives in its forward and backward pass)."""
    groups = len(rollouts) // group_size
    if len(rollouts) % group_size or groups < world_size:
        raise ValueError(
            f"{len(rollouts)} rollouts are not at least {world_size} whole groups of {group_size}"
        )
    base, extra = divmod(groups, world_size)
    first = rank * base + min(rank, extra)
    count = base + (1 if rank < extra else 0)
    return list(rollouts[first * group_size : (first + count) * group_size])


def add_stats(parts: Sequence[LossStats]) -> LossStats:
    """The whole batch's statistics from data-parallel ranks' shares (each normalised by the
    whole batch's token count, so they add up)."""
    return LossStats(
        loss=sum(p.loss for p in parts),
        policy_loss=sum(p.policy_loss for p in parts),
        kl=sum(p.kl for p in parts),
        ratio_mean=sum(p.ratio_mean for p in parts),
        clip_frac=sum(p.clip_frac for p in parts),
        tokens=sum(p.tokens for p in parts),
        entropy=sum(p.entropy for p in parts),
    )
