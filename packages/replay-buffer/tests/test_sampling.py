"""Sampling policies: FIFO, uniform, prioritized, the sum tree, and plugging in your own."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest
from replay_buffer import (
    FifoSampling,
    PrioritizedSampling,
    ReplayBuffer,
    ReplayBufferConfig,
    SamplingPolicy,
    UniformSampling,
    make_policy,
)
from replay_buffer._sumtree import SumTree
from replay_buffer.testing import make_episode


def filled(policy: SamplingPolicy, keys: range, priority: float = 0.0) -> SamplingPolicy:
    for key in keys:
        policy.insert(key, priority)
    return policy


def test_make_policy_builds_each_named_policy() -> None:
    assert isinstance(make_policy("fifo"), FifoSampling)
    assert isinstance(make_policy("uniform"), UniformSampling)
    assert isinstance(make_policy("prioritized"), PrioritizedSampling)
    with pytest.raises(ValueError, match="unknown sampling policy 'lifo'"):
        make_policy("lifo")  # type: ignore[arg-type]


def test_fifo_selects_oldest_first_and_skips_discarded_keys() -> None:
    policy = filled(FifoSampling(), range(6))
    rng = random.Random(0)
    assert policy.select(2, rng) == [0, 1]  # selecting does not remove
    policy.discard(0)
    policy.discard(2)  # from the middle
    assert policy.select(3, rng) == [1, 3, 4]
    policy.insert(6, 0.0)
    assert policy.select(5, rng) == [1, 3, 4, 5, 6]


def test_fifo_memory_stays_bounded_under_middle_discards() -> None:
    policy = FifoSampling()
    policy.insert(0, 0.0)  # stays at the front the whole time
    for key in range(1, 10_000):
        policy.insert(key, 0.0)
        policy.discard(key)
    assert len(policy._queue) < 200  # compacted, not 10_000
    assert policy.select(1, random.Random(0)) == [0]


def test_uniform_draws_each_key_about_equally_often() -> None:
    policy = filled(UniformSampling(), range(10))
    rng = random.Random(1)
    counts: Counter[int] = Counter()
    for _ in range(2000):
        chosen = policy.select(3, rng)
        assert len(set(chosen)) == 3  # without replacement within a batch
        counts.update(chosen)
    assert set(counts) == set(range(10))
    assert all(500 < c < 700 for c in counts.values())  # expected 600 each


def test_uniform_discard_keeps_the_index_dense() -> None:
    policy = filled(UniformSampling(), range(5))
    policy.discard(1)
    policy.discard(4)
    assert sorted(policy.select(3, random.Random(0))) == [0, 2, 3]


def test_prioritized_draws_in_proportion_to_absolute_advantage() -> None:
    policy = PrioritizedSampling(eps=1e-9)
    for key, advantage in enumerate([1.0, -2.0, 3.0, 0.0]):
        policy.insert(key, abs(advantage))
    rng = random.Random(2)
    counts = Counter(policy.select(1, rng)[0] for _ in range(6000))
    assert counts[3] == 0  # zero advantage, next to no weight
    for key, expected in ((0, 1000), (1, 2000), (2, 3000)):
        assert abs(counts[key] - expected) < 200


def test_prioritized_selects_distinct_keys_even_when_one_dominates() -> None:
    policy = PrioritizedSampling()
    policy.insert(0, 1e12)
    for key in range(1, 5):
        policy.insert(key, 0.0)
    chosen = policy.select(5, random.Random(3))
    assert chosen[0] == 0
    assert sorted(chosen) == [0, 1, 2, 3, 4]


def test_prioritized_reuses_slots_and_grows() -> None:
    policy = filled(PrioritizedSampling(), range(100), priority=1.0)
    for key in range(50):
        policy.discard(key)
    filled(policy, range(100, 300), priority=1.0)
    assert sorted(policy.select(250, random.Random(4))) == list(range(50, 300))


def test_prioritized_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError, match="eps must be > 0"):
        PrioritizedSampling(eps=0.0)
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        PrioritizedSampling(alpha=-1.0)


def test_huge_advantages_keep_the_total_finite() -> None:
    policy = PrioritizedSampling(alpha=2.0)
    policy.insert(0, 1e300)
    policy.insert(1, 1e300)
    assert policy._tree.total < float("inf")
    assert sorted(policy.select(2, random.Random(0))) == [0, 1]


def test_sum_tree_total_is_exact_function_of_leaves() -> None:
    a, b = SumTree(8), SumTree(8)
    weights = [0.1, 0.2, 0.3, 1e-9, 5.0, 0.0, 2.5, 0.7]
    for slot, w in enumerate(weights):
        a.set(slot, w)
        a.set(slot, 9.0)  # churn, then restore: no drift may remain
        a.set(slot, w)
    b.load_leaves(weights)
    assert a._tree == b._tree
    assert a.find(0.0) == 0
    assert a.find(a.total * 0.999999) == 7
    a.set(7, 0.0)
    assert a.find(a.total) == 6  # a value at the very end never lands on a zero slot


def test_sum_tree_grow_keeps_every_weight() -> None:
    tree = SumTree(4)
    for slot, w in enumerate([1.0, 2.0, 3.0, 4.0]):
        tree.set(slot, w)
    tree.grow()
    assert tree.capacity == 8
    assert [tree.get(s) for s in range(8)] == [1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 0.0]
    assert tree.total == 10.0
    tree.set(7, 5.0)
    assert tree.total == 15.0
    assert tree.find(14.5) == 7


@pytest.mark.parametrize("name", ["fifo", "uniform", "prioritized"])
def test_policy_state_round_trip_and_mismatch(name: str) -> None:
    rng_state = random.Random(5).getstate()
    source = make_policy(name)  # type: ignore[arg-type]
    for key in range(20):
        source.insert(key, float(key % 3))
    for key in (3, 7, 11):
        source.discard(key)
    priorities = {k: float(k % 3) for k in range(20) if k not in (3, 7, 11)}
    copy = make_policy(name)  # type: ignore[arg-type]
    copy.load_state_dict(source.state_dict(), priorities)
    rng_a, rng_b = random.Random(), random.Random()
    rng_a.setstate(rng_state)
    rng_b.setstate(rng_state)
    for _ in range(5):
        assert source.select(4, rng_a) == copy.select(4, rng_b)
    if name != "fifo":
        wrong = dict(priorities)
        wrong[99] = 1.0
        before = copy.state_dict()
        with pytest.raises(ValueError, match="exactly the held keys"):
            copy.load_state_dict(source.state_dict(), wrong)
        assert copy.state_dict() == before


class NewestFirst:
    """A custom policy through the protocol: the newest items first."""

    def __init__(self) -> None:
        self.keys: list[int] = []

    def insert(self, key: int, priority: float) -> None:
        self.keys.append(key)

    def discard(self, key: int) -> None:
        self.keys.remove(key)

    def select(self, count: int, rng: random.Random) -> list[int]:
        return self.keys[::-1][:count]

    def state_dict(self) -> dict[str, Any]:
        return {"keys": list(self.keys)}

    def load_state_dict(self, state: Mapping[str, Any], priorities: Mapping[int, float]) -> None:
        self.keys = list(state["keys"])


def test_a_custom_policy_plugs_in() -> None:
    assert isinstance(NewestFirst(), SamplingPolicy)
    buffer = ReplayBuffer(policy=NewestFirst())
    buffer.add_many(make_episode(metadata={"id": i}) for i in range(4))
    batch = buffer.sample(0, 2)
    assert batch is not None
    assert [e.metadata["id"] for e in batch.episodes] == [3, 2]


def test_a_non_policy_is_refused() -> None:
    with pytest.raises(TypeError, match="policy must implement SamplingPolicy"):
        ReplayBuffer(policy=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="config must be a ReplayBufferConfig"):
        ReplayBuffer({"max_policy_age": 1})  # type: ignore[arg-type]


class Broken(NewestFirst):
    def select(self, count: int, rng: random.Random) -> list[int]:
        return [self.keys[0]] * count  # duplicates: a bug in the policy


def test_a_misbehaving_policy_is_caught_before_anything_is_handed_out() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(), policy=Broken())
    buffer.add_many([make_episode(), make_episode()])
    with pytest.raises(RuntimeError, match="expected 2 distinct held keys"):
        buffer.sample(0, 2)
    assert len(buffer) == 2
    assert buffer.stats().sampled == 0
