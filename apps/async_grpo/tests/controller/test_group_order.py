"""The controller's batch for the trainer: in group order whichever put arrived first, and a
batch already in order forwarded as the record it came as."""

from __future__ import annotations

import pickle

from async_grpo.controller.loops import _in_group_order
from replay_buffer import Episode, EpisodeBatch
from replay_buffer.testing import make_episode


def _batch(groups: list[int]) -> EpisodeBatch:
    """A batch as it arrives from the buffer (unpickled), one episode per entry of `groups`,
    each a reward telling the episodes apart."""
    episodes = [make_episode(group_id=g, reward=float(k)) for k, g in enumerate(groups)]
    arrived: EpisodeBatch = pickle.loads(pickle.dumps(EpisodeBatch(episodes)))
    return arrived


def _rewards(episodes: EpisodeBatch) -> list[float]:
    return [e.reward for e in episodes]


def test_a_batch_in_group_order_is_forwarded_as_it_came() -> None:
    batch = _batch([1, 1, 3, 3])
    ordered, groups = _in_group_order(batch)
    assert ordered is batch
    assert groups == [1, 3]


def test_puts_that_arrived_out_of_order_are_sorted_by_group_keeping_each_group_s_order() -> None:
    ordered, groups = _in_group_order(_batch([3, 3, 1, 1, 2, 2]))
    assert groups == [1, 2, 3]
    assert [e.group_id for e in ordered] == [1, 1, 2, 2, 3, 3]
    assert _rewards(ordered) == [2.0, 3.0, 4.0, 5.0, 0.0, 1.0]
    assert all(isinstance(e, Episode) for e in ordered)
