"""Group-relative advantages: how much better each answer did than the others to the same prompt."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from async_grpo.config.schema import AdvantageScale


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
