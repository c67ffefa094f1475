"""What was generated, as the buffer's episodes: dropping the groups that teach nothing."""

from __future__ import annotations

import itertools

import torch
from async_grpo.generation.decoding import Completion
from async_grpo.generation.episodes import drop_uniform_groups, teaches_nothing, to_episodes
from replay_buffer import Episode


def completion(text: str) -> Completion:
    return Completion("count to 2:", text, [1, 2], [3, 4], [-0.5, -0.5], True, 0)


def test_groups_whose_rewards_are_all_equal_are_dropped_whole() -> None:
    groups = [[completion("1 2"), completion("2")] for _ in range(3)]
    # Group 10: both right; group 11: one right; group 12: both wrong.
    rewards = [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    episodes = to_episodes(groups, rewards, itertools.count(10))
    kept, dropped = drop_uniform_groups(episodes)
    assert dropped == {10, 12}
    assert [e.group_id for e in kept] == [11, 11]
    assert all(not teaches_nothing(e) for e in kept)


def turn_episode(token_advantages: torch.Tensor) -> Episode:
    return Episode(
        prompt_ids=torch.tensor([1]),
        response_ids=torch.tensor([2, 3]),
        behavior_logprobs=torch.tensor([-0.5, -0.5]),
        reward=1.0,
        advantage=0.0,
        policy_version=0,
        group_id=1,
        token_advantages=token_advantages,
    )


def test_per_turn_credit_counts_every_token() -> None:
    quiet = turn_episode(torch.zeros(2))
    one_turn = turn_episode(torch.tensor([0.0, 0.5]))
    assert teaches_nothing(quiet)
    assert not teaches_nothing(one_turn)  # its episode advantage is 0, a turn's is not
    assert drop_uniform_groups([quiet, one_turn]) == ([quiet, one_turn], set())
