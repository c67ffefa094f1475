"""GRPO's math as pure functions: group-normalised advantages and the token-level loss.

Nothing here knows about models, processes or Monarch; tests check every formula against
hand-computed values.

Shapes: B sequences (episodes), T response positions (right-padded), `mask` is 1.0 on real
response tokens and 0.0 on padding. Log-probs are natural-log probabilities of the sampled
tokens, float32.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

ImportanceMode = Literal["clip", "truncate"]
AdvantageScale = Literal["std", "mean", "none"]
"""What a group's centred rewards are divided by: "std" their standard deviation (GRPO),
"mean" their mean measured from the group's lowest reward, mean(r) - min(r) (MaxRL, Tajwar
et al. 2026, made shift-invariant: for 0/1 rewards it is MaxRL's mean, and the expected
update is the gradient of log P(success), the supervised gradient of the right answer),
"none" nothing."""


def group_advantages(
    rewards: Tensor, group_size: int, scale: AdvantageScale = "std", eps: float = 1e-6
) -> Tensor:
    """Advantage of each episode relative to the others answering the same prompt.

    `rewards` is [B] with B a multiple of `group_size`, consecutive entries sharing a prompt.
    Returns [B]: `r - mean(group)`, divided by the group's (population) standard deviation
    plus `eps` (`scale="std"`), by its mean above its lowest reward plus `eps` (`"mean"`)
    or by nothing (`"none"`). A group whose rewards are all equal gets zeros: it says
    nothing about which answer is better.

    Why "mean" can matter: under "std" (and "none") the expected update of an answer's
    logit is symmetric in its success rate q (sqrt(q(1-q)) under "std"), so a policy that
    cannot yet tell two contexts apart drifts freely towards one answer for both and, once
    it is sure, its groups go uniform. Under "mean" it is 1 - q, the supervised gradient:
    an answer the policy rarely says but that is right is pulled up hardest.

    Why from the lowest reward: MaxRL divides by the mean itself, which is right for 0/1
    rewards but not shift-invariant. Partial credit that every answer earns (a floor of 0.4
    under wrong answers) inflates the mean and shrinks the pull: one right answer among 16
    answers at 0.4 would get (1 - 0.44) / 0.44 = 1.3 instead of the 15 it gets among 16
    zeros. Measured from the floor it gets 15 in both. Wherever a group's lowest reward
    is 0 (every non-uniform group of 0/1 rewards) nothing changes.
    """
    if rewards.dim() != 1 or rewards.numel() % group_size != 0:
        raise ValueError(
            f"rewards must be 1-D with a multiple of group_size={group_size} entries, "
            f"got shape {tuple(rewards.shape)}"
        )
    if scale not in ("std", "mean", "none"):
        raise ValueError(f"scale must be 'std', 'mean' or 'none', got {scale!r}")
    # float64: rewards a few float32 ulps apart (continuous rewards, reward models) have a
    # float32 mean that can fall outside the group's range, which gave every member of
    # such a group one sign, or flipped them all under "mean". Every float32 value is
    # exact in float64, and the clamp keeps a mean inside [min, max] whatever rounds.
    r = rewards.double().view(-1, group_size)
    low = r.min(dim=1, keepdim=True).values
    mean = r.mean(dim=1, keepdim=True).clamp(low, r.max(dim=1, keepdim=True).values)
    centred = r - mean
    if scale == "std":
        centred = centred / (r.std(dim=1, keepdim=True, correction=0) + eps)
    elif scale == "mean":
        centred = centred / (mean - low + eps)
    # Decided on the rewards themselves, not on a mean or std: those round, and a group of
    # seven 0.7s would otherwise get a spurious advantage of one sign.
    uniform = (r == r[:, :1]).all(dim=1, keepdim=True)
    return torch.where(uniform, torch.zeros_like(centred), centred).reshape(-1).float()


def turn_advantages(
    rewards: Sequence[Sequence[float]],
    *,
    discount: float = 1.0,
    scale: AdvantageScale = "std",
    eps: float = 1e-6,
) -> list[list[float]]:
    """Advantage of each policy turn of a group of multi-turn episodes of one task.

    `rewards[i][t]` is the reward episode i's turn t earned; episodes may have different
    numbers of turns (one that ends early has fewer). A turn's return is its reward plus
    `discount` times the next turn's return: `discount` 1 credits a turn with everything that
    followed it, 0 with its own reward only (right when turns do not affect each other, as
    in a quiz). Turn t's advantage is its return minus the mean return at turn t over the
    episodes that reached turn t, scaled as `group_advantages` scales a group (`scale`);
    where those returns are all equal (or only one episode got
    that far) it is 0. Returns the advantages in the shape of `rewards`.
    """
    if not 0.0 <= discount <= 1.0:
        raise ValueError(f"discount must be in [0, 1], got {discount}")
    if not rewards:
        raise ValueError("turn_advantages needs at least one episode")
    returns: list[list[float]] = []
    for turns in rewards:
        after = 0.0
        backwards = []
        for r in reversed(turns):
            after = float(r) + discount * after
            backwards.append(after)
        returns.append(backwards[::-1])
    out = [[0.0] * len(g) for g in returns]
    for t in range(max(len(g) for g in returns)):
        rows = [i for i, g in enumerate(returns) if len(g) > t]
        column = torch.tensor([returns[i][t] for i in rows])
        values = group_advantages(column, len(rows), scale, eps)  # equal: zeros
        for i, v in zip(rows, values.tolist(), strict=True):
            out[i][t] = v
    return out


def k3_kl(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(policy || reference): exp(d) - d - 1 with d = ref - lp.

    Unbiased for samples drawn from the policy, never negative, lower variance than -d.
    """
    d = ref_logprobs - logprobs
    return torch.exp(d) - d - 1.0


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """How the policy-gradient term is formed; ρ is the ratio of the current policy to the
    behavior policy that sampled the token.

    `importance="clip"`: PPO's clipped surrogate, min(ρA, clip(ρ, 1-ε, 1+ε)A).
    `importance="truncate"`: truncated importance weights, -min(ρ, `truncate_cap`)·A·log π
    with the weight held constant (no gradient through it). The entropy bonus keeps the
    policy exploring where a group would otherwise settle on one answer, since a group whose
    answers are all equal gives no gradient.
    """

    clip_eps: float = 0.2
    """ε of the clipped surrogate: ρ is clipped to [1 - ε, 1 + ε] (importance="clip")."""
    importance: ImportanceMode = "clip"
    """Off-policy correction: PPO-style "clip" or truncated importance weights "truncate"."""
    truncate_cap: float = 2.0
    """Largest importance weight (importance="truncate"), >= 1."""
    kl_coef: float = 0.0
    """Weight of the k3 KL to the reference model in the loss; 0 turns it off."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (mean entropy at the sampled positions, subtracted)."""


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
    is needed when `cfg.kl_coef > 0`.
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
