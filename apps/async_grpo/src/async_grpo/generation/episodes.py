"""From what was played to the buffer's episodes: rewards become group advantages.

Pure: the controller calls `to_episodes` between the reward service and the replay buffer
(one prompt, one response), `records_to_episodes` after a multi-turn play.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from replay_buffer import Columns, Episode, EpisodeBatch, GroupId
from rl_envs import tokenize_episode

from async_grpo.config.schema import AdvantageScale
from async_grpo.generation.decoding import Completion
from async_grpo.generation.multiturn import (
    Encode,
    PlayedEpisode,
    policy_version,
    turn_ids,
    turn_logprobs,
)
from async_grpo.grpo.advantages import group_advantages, turn_advantages


def to_episodes(
    groups: Sequence[Sequence[Completion]],
    rewards: Sequence[float],
    group_ids: Iterator[int],
    *,
    scale: AdvantageScale = "std",
) -> EpisodeBatch:
    """One episode per completion, group by group, as one `EpisodeBatch`. `groups` holds the
    completions of one prompt each (all the same size); `rewards` is flat, in the same
    order; each group takes the next id of `group_ids`."""
    sizes = {len(g) for g in groups}
    if len(sizes) != 1:
        raise ValueError(f"every prompt needs the same number of completions, got {sorted(sizes)}")
    (group_size,) = sizes
    flat = [comp for group in groups for comp in group]
    if len(rewards) != len(flat):
        raise ValueError(f"{len(flat)} completions but {len(rewards)} rewards")
    advantages = group_advantages(torch.tensor(rewards), group_size, scale=scale)
    # Built field by field and checked once for the whole batch: 128 episodes made and
    # checked one by one cost the controller about 2 ms a step on the 2-core machine.
    columns = Columns(
        prompt_lens=torch.tensor([len(c.prompt_ids) for c in flat], dtype=torch.long),
        response_lens=torch.tensor([len(c.response_ids) for c in flat], dtype=torch.long),
        prompt_ids=_joined([c.prompt_ids for c in flat], torch.long),
        response_ids=_joined([c.response_ids for c in flat], torch.long),
        behavior_logprobs=_joined([c.behavior_logprobs for c in flat], torch.float32),
        loss_mask=None,
        token_advantages=None,
        reward=torch.tensor(rewards, dtype=torch.float64),
        advantage=advantages.double(),
        policy_version=torch.tensor([c.policy_version for c in flat], dtype=torch.long),
    )
    ids = [next(group_ids) for _ in groups]
    return EpisodeBatch.from_columns(columns, [g for g in ids for _ in range(group_size)])


def _joined(rows: Sequence[Sequence[int] | Sequence[float]], dtype: torch.dtype) -> torch.Tensor:
    """`rows` end to end, as one 1-D tensor of `dtype`."""
    return torch.tensor([x for row in rows for x in row], dtype=dtype)


def records_to_episodes(
    groups: Sequence[Sequence[PlayedEpisode]],
    group_ids: Iterator[int],
    encode: Encode,
    *,
    scale: AdvantageScale = "std",
    turn_discount: float | None = None,
) -> tuple[list[Episode], int]:
    """One `Episode` per multi-turn episode, and how many were dropped.

    Each group holds the episodes of one task (all the same size). A group with a failed
    episode is dropped whole (its advantages would compare episodes with a missing one);
    the count returned includes all of its episodes. An episode's response is everything
    after the environment's first observation, its `loss_mask` marks the policy's tokens
    (the environment's are context), its behaviour log-probs are the sampled ones (0.0 at
    environment tokens, never read), its reward is its return (the sum of its turns'
    rewards) and its `policy_version` the oldest version that sampled a turn of it.
    """
    sizes = {len(g) for g in groups}
    if len(sizes) > 1:
        raise ValueError(f"every task needs the same number of episodes, got {sorted(sizes)}")
    kept = [g for g in groups if all(r.ok for r in g)]
    dropped = sum(len(g) for g in groups) - sum(len(g) for g in kept)
    if not kept:
        return [], dropped
    returns = [r.reward for g in kept for r in g]
    advantages = group_advantages(torch.tensor(returns), len(kept[0]), scale=scale)
    episodes: list[Episode] = []
    k = 0
    for group in kept:
        group_id = next(group_ids)
        per_turn = (
            turn_advantages([r.rewards for r in group], discount=turn_discount, scale=scale)
            if turn_discount is not None
            else None
        )
        for i, record in enumerate(group):
            tok = tokenize_episode(
                record, encode=encode, token_ids=turn_ids, logprobs=turn_logprobs
            )
            token_advantages = None
            if per_turn is not None:
                # Environment tokens (turn -1) are never trained: 0.0 there.
                turn_adv = per_turn[i]
                token_advantages = torch.tensor(
                    [turn_adv[t] if t >= 0 else 0.0 for t in tok.turns], dtype=torch.float32
                )
            episodes.append(
                Episode(
                    prompt_ids=torch.tensor(tok.prompt_ids, dtype=torch.long),
                    response_ids=torch.tensor(tok.response_ids, dtype=torch.long),
                    behavior_logprobs=torch.tensor(tok.behavior_logprobs, dtype=torch.float32),
                    reward=tok.reward,
                    advantage=float(advantages[k]),
                    policy_version=policy_version(record),
                    group_id=group_id,
                    loss_mask=torch.tensor(tok.policy_mask, dtype=torch.bool),
                    token_advantages=token_advantages,
                )
            )
            k += 1
    return episodes, dropped


def teaches_nothing(episode: Episode) -> bool:
    """Every advantage of `episode` is zero: its group's returns were all equal."""
    if episode.token_advantages is None:
        return episode.advantage == 0.0
    return not bool(episode.token_advantages.any())


def drop_uniform_groups(episodes: Sequence[Episode]) -> tuple[list[Episode], set[GroupId]]:
    """`episodes` without the groups in which every episode teaches nothing (DAPO's dynamic
    sampling), and the ids of those groups."""
    by_group: dict[GroupId | None, list[Episode]] = {}
    for e in episodes:
        by_group.setdefault(e.group_id, []).append(e)
    useless = {
        g for g, members in by_group.items() if g is not None and all(map(teaches_nothing, members))
    }
    return [e for e in episodes if e.group_id not in useless], useless
