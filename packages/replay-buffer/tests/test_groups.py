"""Grouped buffers (GRPO): groups enter, age, leave and are sampled whole."""

from __future__ import annotations

import pytest
from replay_buffer import Episode, ReplayBuffer, ReplayBufferConfig
from replay_buffer.testing import make_episode, make_group, states_equal


def group_ids(episodes: tuple[Episode, ...]) -> list[object]:
    return [e.group_id for e in episodes]


def test_sampled_groups_are_whole_and_each_shard_holds_whole_groups() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(group_size=2, dp_size=2, sampling="uniform"))
    for g in range(6):
        buffer.add_many(make_group(g, 2))
    batch = buffer.sample(0, 8)
    assert batch is not None
    assert len(batch) == 8
    for shard in batch.shards:
        assert len(shard) == 4
        # Members of a group sit next to each other, two whole groups per shard.
        assert shard[0].group_id == shard[1].group_id
        assert shard[2].group_id == shard[3].group_id
        assert [e.metadata["member"] for e in shard] == [0, 1, 0, 1]
    assert len(set(group_ids(batch.episodes))) == 4
    assert len(buffer) == 4


@pytest.mark.parametrize("batch_size", [2, 6, 3])
def test_batch_size_must_be_a_multiple_of_group_size_times_dp_size(batch_size: int) -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(group_size=2, dp_size=2))
    buffer.add_many(make_group("a", 2) + make_group("b", 2))
    before = buffer.state_dict()
    with pytest.raises(ValueError, match=r"multiple of group_size\*dp_size=2\*2"):
        buffer.sample(0, batch_size)
    assert states_equal(buffer.state_dict(), before)


def test_a_partial_group_is_rejected_and_nothing_of_the_call_is_added() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(group_size=3))
    with pytest.raises(ValueError, match=r"group_id='b' has 2 episodes in this call"):
        buffer.add_many(make_group("a", 3) + make_group("b", 2))
    with pytest.raises(ValueError, match="group_id='a' has 1 episodes"):
        buffer.add(make_episode(group_id="a"))
    assert len(buffer) == 0
    assert buffer.stats().added == 0


def test_a_bad_group_in_the_middle_of_a_call_adds_no_group() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(group_size=2))
    buffer.add_many(make_group("held", 2))
    before = buffer.state_dict()
    call = [*make_group("a", 2), *make_group("held", 2), *make_group("b", 2)]
    with pytest.raises(ValueError, match="group_id='held' is already held"):
        buffer.add_many(call)
    assert states_equal(buffer.state_dict(), before)
    assert buffer.stats().added == 2


def test_group_members_may_be_interleaved_in_one_call() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(group_size=2))
    a, b = make_group("a", 2), make_group("b", 2)
    buffer.add_many([a[0], b[0], b[1], a[1]])
    batch = buffer.sample(0, 4)
    assert batch is not None
    assert group_ids(batch.episodes) == ["a", "a", "b", "b"]


def test_an_episode_without_group_id_is_rejected() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(group_size=2))
    with pytest.raises(ValueError, match=r"episodes\[1\].group_id is None"):
        buffer.add_many([make_episode(group_id=1), make_episode()])
    assert len(buffer) == 0


def test_a_held_group_id_cannot_be_added_again_until_it_leaves() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(group_size=2))
    buffer.add_many(make_group("a", 2))
    with pytest.raises(ValueError, match="group_id='a' is already held"):
        buffer.add_many(make_group("a", 2))
    assert len(buffer) == 2
    assert buffer.sample(0, 2) is not None  # group "a" is used up and retired
    buffer.add_many(make_group("a", 2))
    assert len(buffer) == 2


def test_capacity_eviction_drops_the_oldest_whole_group() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(group_size=2, max_buffer_size=5))
    for g in ("a", "b", "c"):
        buffer.add_many(make_group(g, 2))
    assert len(buffer) == 4
    assert buffer.stats().evicted_capacity == 2
    batch = buffer.sample(0, 4)
    assert batch is not None
    assert group_ids(batch.episodes) == ["b", "b", "c", "c"]


def test_a_group_is_as_stale_as_its_oldest_member() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(group_size=2, max_policy_age=1))
    old = [
        make_episode(group_id="old", policy_version=0),
        make_episode(group_id="old", policy_version=2),
    ]
    buffer.add_many(old + make_group("new", 2, policy_version=2))
    batch = buffer.sample(2, 2)
    assert batch is not None
    assert group_ids(batch.episodes) == ["new", "new"]
    s = buffer.stats()
    assert (s.evicted_stale, s.held) == (2, 0)


def test_group_priority_is_the_mean_absolute_advantage() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(group_size=2, sampling="prioritized"))
    buffer.add_many(
        [
            make_episode(group_id="signal", advantage=1.0),
            make_episode(group_id="signal", advantage=-1.0),
            *make_group("flat", 2, advantage=0.0),
        ]
    )
    # |advantage| 1.0 + eps against 0.0 + eps (eps = 1e-3): "signal" first, nearly always.
    batch = buffer.sample(0, 2)
    assert batch is not None
    assert group_ids(batch.episodes) == ["signal", "signal"]
