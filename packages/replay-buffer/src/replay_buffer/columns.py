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
