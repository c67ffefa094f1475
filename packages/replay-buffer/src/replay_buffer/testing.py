"""Helpers for tests and benchmarks that need valid episodes without a model."""

from __future__ import annotations

from typing import Any

import torch

from replay_buffer.episode import Episode, GroupId


def make_episode(
    *,
    policy_version: int = 0,
    advantage: float = 0.0,
    reward: float = 0.0,
    group_id: GroupId | None = None,
    prompt_len: int = 3,
    response_len: int = 4,
    metadata: dict[str, Any] | None = None,
) -> Episode:
    """A valid episode with placeholder tokens (`0, 1, ...`) and log-probs of `-0.5`."""
    return Episode(
        prompt_ids=torch.arange(prompt_len, dtype=torch.long),
        response_ids=torch.arange(response_len, dtype=torch.long),
        behavior_logprobs=torch.full((response_len,), -0.5, dtype=torch.float32),
        reward=reward,
        advantage=advantage,
        policy_version=policy_version,
        group_id=group_id,
        metadata={} if metadata is None else metadata,
    )


def make_group(
    group_id: GroupId, size: int, *, policy_version: int = 0, advantage: float = 0.0
) -> list[Episode]:
    """`size` episodes sharing `group_id`, tagged `metadata["member"] = 0 .. size-1`."""
    return [
        make_episode(
            policy_version=policy_version,
            advantage=advantage,
            group_id=group_id,
            metadata={"member": i},
        )
        for i in range(size)
    ]


def states_equal(a: Any, b: Any) -> bool:
    """Deep equality for `state_dict()` output: tensors by dtype, shape and values."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and torch.equal(a, b)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(states_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return (
            type(a) is type(b)
            and len(a) == len(b)
            and all(states_equal(x, y) for x, y in zip(a, b, strict=True))
        )
    return type(a) is type(b) and bool(a == b)
