"""A batch of episodes field by field: what a trainer turns into padded tensors with a few
tensor operations instead of a visit to every episode."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, eq=False)
class Columns:
    """B episodes field by field: each tensor field of every episode laid end to end in one
    tensor (in episode order), each number field as one tensor of B values. Episode i's
    response tokens are `response_ids[s : s + response_lens[i]]` with
    `s = response_lens[:i].sum()`, and likewise for its prompt.

    The optional fields keep their `Episode` meaning: an episode without a `loss_mask` has
    all its response tokens marked True, one without `token_advantages` repeats its
    `advantage` on every token. Read-only, like the episodes' own tensors.

    Attributes:
        prompt_lens: [B] int64, each episode's prompt length.
        response_lens: [B] int64, each episode's response length.
        prompt_ids: [sum of prompt_lens] int64.
        response_ids: [sum of response_lens] int64.
        behavior_logprobs: [sum of response_lens] float32, natural-log probabilities.
        loss_mask: [sum of response_lens] bool, or None when no episode has one.
        token_advantages: [sum of response_lens] float32, or None when no episode has them.
        reward: [B] float64.
        advantage: [B] float64.
        policy_version: [B] int64.
    """

    prompt_lens: torch.Tensor
    response_lens: torch.Tensor
    prompt_ids: torch.Tensor
    response_ids: torch.Tensor
    behavior_logprobs: torch.Tensor
    loss_mask: torch.Tensor | None
    token_advantages: torch.Tensor | None
    reward: torch.Tensor
    advantage: torch.Tensor
    policy_version: torch.Tensor

    def __len__(self) -> int:
        return len(self.response_lens)

    @property
    def policy_tokens(self) -> int:
        """Response tokens the policy produced (`Episode.num_policy_tokens`, summed)."""
        if self.loss_mask is None:
            return int(self.response_lens.sum())
        return int(self.loss_mask.sum())

    def token_episodes(self) -> torch.Tensor:
        """[sum of response_lens] int64: the episode (its index in this batch) of every
        response token."""
        return torch.repeat_interleave(torch.arange(len(self)), self.response_lens)


def check_columns(cols: Columns) -> None:
    """Raises `TypeError` or `ValueError` naming the field (and the first episode it is
    wrong in) unless every episode of `cols` would pass `Episode`'s own checks: the batch's
    checks in one pass per field instead of one per episode."""
    n = _check_lens("prompt_lens", cols.prompt_lens, None)
    _check_lens("response_lens", cols.response_lens, n)
    tokens = int(cols.response_lens.sum())
    _check_flat("prompt_ids", cols.prompt_ids, torch.long, int(cols.prompt_lens.sum()))
    _check_flat("response_ids", cols.response_ids, torch.long, tokens)
    logprobs = _check_flat("behavior_logprobs", cols.behavior_logprobs, torch.float32, tokens)
    bad = ~(torch.isfinite(logprobs) & (logprobs <= 0))
    if bool(bad.any()):
        raise ValueError(
            f"episode {_owner(cols, bad)}: Episode.behavior_logprobs must be finite "
            "natural-log probabilities (<= 0)"
        )
    if cols.loss_mask is not None:
        mask = _check_flat("loss_mask", cols.loss_mask, torch.bool, tokens)
        marked = torch.zeros(n, dtype=torch.long).index_add_(0, cols.token_episodes(), mask.long())
        if bool((marked == 0).any()):
            first = int((marked == 0).nonzero()[0])
            raise ValueError(
                f"episode {first}: Episode.loss_mask must mark at least one policy token, got none"
            )
    if cols.token_advantages is not None:
        advantages = _check_flat("token_advantages", cols.token_advantages, torch.float32, tokens)
        if not bool(torch.isfinite(advantages).all()):
            raise ValueError(
                f"episode {_owner(cols, ~torch.isfinite(advantages))}: "
                "Episode.token_advantages must be finite, got NaN or inf"
            )
    for name in ("reward", "advantage", "policy_version"):
        values = getattr(cols, name)
        if values.shape != (n,):
            raise ValueError(f"Columns.{name} must hold one value per episode ({n})")
    for name in ("reward", "advantage"):
        finite = torch.isfinite(getattr(cols, name))
        if not bool(finite.all()):
            first = int((~finite).nonzero()[0])
            raise ValueError(f"episode {first}: Episode.{name} must be finite")
    if cols.policy_version.dtype != torch.long or bool((cols.policy_version < 0).any()):
        raise ValueError("Episode.policy_version must be an int >= 0 for every episode")


def _check_lens(name: str, lens: torch.Tensor, n: int | None) -> int:
    if lens.dtype != torch.long or lens.dim() != 1 or (n is not None and len(lens) != n):
        raise ValueError(f"Columns.{name} must be a 1-D int64 tensor of one length per episode")
    if bool((lens < 1).any()):
        first = int((lens < 1).nonzero()[0])
        field = name.removesuffix("_lens")
        raise ValueError(
            f"episode {first}: Episode.{field}_ids must hold at least one token, got 0"
        )
    return len(lens)


def _check_flat(name: str, tensor: torch.Tensor, dtype: torch.dtype, length: int) -> torch.Tensor:
    if tensor.dim() != 1 or tensor.dtype is not dtype:
        raise TypeError(f"Columns.{name} must be a 1-D {dtype} tensor")
    if len(tensor) != length:
        raise ValueError(
            f"Columns.{name} must hold {length} values (the lengths' sum), got {len(tensor)}"
        )
    if tensor.requires_grad:
        raise ValueError(f"Episode.{name} must not require grad; pass {name}.detach()")
    return tensor


def _owner(cols: Columns, bad: torch.Tensor) -> int:
    """The episode of the first response token marked in `bad`."""
    return int(cols.token_episodes()[bad.nonzero()[0]])
