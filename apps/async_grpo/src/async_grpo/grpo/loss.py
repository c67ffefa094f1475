"""GRPO's math as pure functions: group-normalised advantages and the token-level loss.

Nothing here knows about models, processes or Monarch; tests check every formula against
hand-computed values.

Shapes: B sequences (episodes), T response positions (right-padded), `mask` is 1.0 on real
response tokens and 0.0 on padding. Log-probs are natural-log probabilities of the sampled
tokens, float32.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from async_grpo.config.schema import LossConfig


def k3_kl(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(policy || reference): exp(d) - d - 1 with d = ref - lp.

    Unbiased for samples drawn from the policy, never negative, lower variance than -d.
    """
    d = ref_logprobs - logprobs
    return torch.exp(d) - d - 1.0


@dataclasses.dataclass(frozen=True)
class LossStats:
    """Scalars describing one loss evaluation (means over real response tokens)."""

    loss: float
    policy_loss: float
    kl: float
    ratio_mean: float
    clip_frac: float
    tokens: int
    entropy: float = 0.0


def grpo_loss(
    logprobs: Tensor,
    behavior_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: LossConfig,
    *,
    ref_logprobs: Tensor | None = None,
    token_count: float | None = None,
    entropy: Tensor | None = None,
) -> tuple[Tensor, LossStats]:
    """Token-level GRPO loss: the mean over every real response token in the batch.

    `logprobs` [B, T] carry gradient (current policy); `behavior_logprobs` [B, T] are what
    the generator's sampling distribution gave the same tokens; `advantages` is [B] (one per
    sequence, broadcast over its tokens) or [B, T] (one per token); `ref_logprobs` [B, T]
    is needed when `cfg.kl_coef > 0`. `mask` may weigh a row's tokens by more than 1: a row
    that stands for n identical sequences counts n times in every sum (`tokens` included).
    Averaging over tokens (not per sequence first) weighs every token equally, so long
    answers are not diluted. `token_count` replaces the divisor `mask.sum()` (a data-parallel
    rank holding part of a batch passes the whole batch's count, so the ranks' losses and
    statistics add up to the whole batch's). `entropy` [B, T] is the current policy's
    per-token entropy (needed when `cfg.entropy_coef > 0`, reported whenever given).
    """
    if cfg.kl_coef > 0 and ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs")
    if cfg.entropy_coef > 0 and entropy is None:
        raise ValueError("entropy_coef > 0 needs entropy")
    if token_count is not None and token_count < 1:
        raise ValueError(f"token_count must be >= 1, got {token_count}")
    mask = mask.float()
    n_tokens = mask.sum().clamp(min=1.0) if token_count is None else torch.tensor(token_count)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    if (
        advantages.dim() != 2
        or advantages.shape[0] != logprobs.shape[0]
        or (advantages.shape[1] not in (1, logprobs.shape[1]))
    ):
        raise ValueError(
            f"advantages must be [B] or [B, T] for logprobs {list(logprobs.shape)}, "
            f"got {list(advantages.shape)}"
        )
    adv = advantages.float().expand_as(logprobs)
    ratio = torch.exp(logprobs - behavior_logprobs)
    if cfg.importance == "clip":
        clipped = torch.clamp(ratio, 1.0 - cfg.clip_eps, 1.0 + cfg.clip_eps)
        per_token = -torch.minimum(ratio * adv, clipped * adv)
        clip_hit = ((ratio * adv) > (clipped * adv)).float()
    elif cfg.importance == "truncate":
        weight = torch.clamp(ratio, max=cfg.truncate_cap).detach()
        per_token = -weight * adv * logprobs
        clip_hit = (ratio > cfg.truncate_cap).float()
    else:
        raise ValueError(f"unknown importance mode {cfg.importance!r}")
    policy_loss = (per_token * mask).sum() / n_tokens
    kl = torch.zeros((), dtype=policy_loss.dtype)
    if ref_logprobs is not None:
        kl = (k3_kl(logprobs, ref_logprobs) * mask).sum() / n_tokens
    loss = policy_loss + cfg.kl_coef * kl if cfg.kl_coef > 0 else policy_loss
    mean_entropy = torch.zeros((), dtype=policy_loss.dtype)
    if entropy is not None:
        mean_entropy = (entropy * mask).sum() / n_tokens
        if cfg.entropy_coef > 0:
            loss = loss - cfg.entropy_coef * mean_entropy
    stats = LossStats(
        loss=float(loss.detach()),
        policy_loss=float(policy_loss.detach()),
        kl=float(kl.detach()),
        ratio_mean=float(((ratio * mask).sum() / n_tokens).detach()),
        clip_frac=float(((clip_hit * mask).sum() / n_tokens).detach()),
        tokens=int(mask.sum().item()),
        entropy=float(mean_entropy.detach()),
    )
    return loss, stats
