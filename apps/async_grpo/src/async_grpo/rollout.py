"""From sampled completions to the buffer's episodes: rewards become group advantages.

Pure: the controller calls it between the reward service and the replay buffer.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from replay_buffer import Episode

from async_grpo.grpo import group_advantages
from async_grpo.sampling import Completion


def to_episodes(
    groups: Sequence[Sequence[Completion]],
    rewards: Sequence[float],
    group_ids: Iterator[int],
    *,
    scale_by_std: bool = True,
) -> list[Episode]:
    """One `Episode` per completion, group by group. `groups` holds the completions of one
    prompt each (all the same size); `rewards` is flat, in the same order; each group takes
    the next id of `group_ids`."""
    sizes = {len(g) for g in groups}
    if len(sizes) != 1:
        raise ValueError(f"every prompt needs the same number of completions, got {sorted(sizes)}")
    (group_size,) = sizes
    flat = [comp for group in groups for comp in group]
    if len(rewards) != len(flat):
        raise ValueError(f"{len(flat)} completions but {len(rewards)} rewards")
    advantages = group_advantages(torch.tensor(rewards), group_size, scale_by_std=scale_by_std)
    episodes: list[Episode] = []
    for k, comp in enumerate(flat):
        if k % group_size == 0:
            group = next(group_ids)
        episodes.append(
            Episode(
                prompt_ids=torch.tensor(comp.prompt_ids, dtype=torch.long),
                response_ids=torch.tensor(comp.response_ids, dtype=torch.long),
                behavior_logprobs=torch.tensor(comp.behavior_logprobs, dtype=torch.float32),
                reward=rewards[k],
                advantage=float(advantages[k]),
                policy_version=comp.policy_version,
                group_id=group,
            )
        )
    return episodes
