"""ReplayBuffer rules: sampling, staleness, capacity, reuse, data-parallel split, stats, and
that every rejected call leaves the buffer exactly as it was."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from replay_buffer import Episode, ReplayBuffer, ReplayBufferConfig
from replay_buffer.testing import make_episode, states_equal


def tagged(n: int, *, version: int = 0, start: int = 0) -> list[Episode]:
    """`n` episodes tagged `metadata["id"] = start ..`, all at `version`."""
    return [make_episode(policy_version=version, metadata={"id": start + i}) for i in range(n)]


def ids(episodes: tuple[Episode, ...] | list[Episode]) -> list[int]:
    return [e.metadata["id"] for e in episodes]


def assert_rejected_without_change(
    buffer: ReplayBuffer, call: Callable[[], object], error: type[Exception], message: str
) -> None:
    before, stats = buffer.state_dict(), buffer.stats()
    with pytest.raises(error) as info:
        call()
    assert message in str(info.value)
    assert states_equal(buffer.state_dict(), before)
    assert buffer.stats() == stats


# ---------------------------------------------------------------------------- sampling


def test_sample_returns_none_until_enough_episodes_are_held() -> None:
    buffer = ReplayBuffer()
    buffer.add_many(tagged(3))
    assert buffer.sample(0, 4) is None
    assert len(buffer) == 3  # a None sample consumes nothing
    buffer.add(make_episode(metadata={"id": 3}))
    batch = buffer.sample(0, 4)
    assert batch is not None
    assert ids(batch.episodes) == [0, 1, 2, 3]  # FIFO by default
    assert len(batch) == 4
    assert batch.curr_policy_version == 0
    assert batch.dp_size == 1
    assert len(buffer) == 0


def test_dp_split_gives_each_rank_an_equal_contiguous_shard() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(dp_size=3))
    buffer.add_many(tagged(6))
    batch = buffer.sample(0, 6)
    assert batch is not None
    assert [ids(shard) for shard in batch.shards] == [[0, 1], [2, 3], [4, 5]]
    assert ids(batch.episodes) == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    ("config", "batch_size", "error", "message"),
    [
        (ReplayBufferConfig(), 0, ValueError, "batch_size must be > 0, got 0"),
        (ReplayBufferConfig(), -2, ValueError, "batch_size must be > 0"),
        (ReplayBufferConfig(), 2.0, TypeError, "batch_size must be an int"),
        (ReplayBufferConfig(dp_size=4), 6, ValueError, "multiple of dp_size=4"),
        (ReplayBufferConfig(max_buffer_size=4), 5, ValueError, "exceeds max_buffer_size=4"),
        (ReplayBufferConfig(admission_limit=4), 8, ValueError, "exceeds admission_limit=4"),
    ],
)
def test_bad_batch_size_is_rejected_without_change(
    config: ReplayBufferConfig, batch_size: int, error: type[Exception], message: str
) -> None:
    buffer = ReplayBuffer(config)
    buffer.add_many(tagged(4, version=0))
    buffer.sample(1, 4 if config.dp_size == 4 else 1)  # leave some history behind
    assert_rejected_without_change(buffer, lambda: buffer.sample(1, batch_size), error, message)


def test_policy_version_may_not_go_back_or_be_negative() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(max_policy_age=0))
    buffer.add_many(tagged(4, version=5))
    assert buffer.sample(5, 1) is not None
    assert_rejected_without_change(
        buffer, lambda: buffer.sample(4, 1), ValueError, "curr_policy_version 4 is lower than 5"
    )
    assert_rejected_without_change(
        buffer, lambda: buffer.sample(-1, 1), ValueError, "curr_policy_version must be >= 0"
    )
    assert buffer.sample(5, 1) is not None  # the same version again is fine


# ---------------------------------------------------------------------------- staleness


def test_episodes_older_than_max_policy_age_are_evicted_before_sampling() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(max_policy_age=2))
    buffer.add_many(
        tagged(2, version=0) + tagged(2, version=1, start=2) + tagged(1, version=3, start=4)
    )
    batch = buffer.sample(3, 3)  # age(v0) = 3 > 2: evicted; v1 (age 2) and v3 stay
    assert batch is not None
    assert ids(batch.episodes) == [2, 3, 4]
    stats = buffer.stats()
    assert (stats.evicted_stale, stats.held, stats.sampled) == (2, 0, 3)
    assert (stats.sample_age_min, stats.sample_age_max) == (0, 2)
    assert stats.sample_age_mean == pytest.approx((2 + 2 + 0) / 3)


def test_max_policy_age_zero_is_strictly_on_policy() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(max_policy_age=0))
    buffer.add_many(tagged(2, version=0) + tagged(2, version=1, start=2))
    assert buffer.sample(1, 4) is None  # only 2 episodes are fresh at version 1
    assert buffer.stats().evicted_stale == 2
    assert len(buffer) == 2
    batch = buffer.sample(1, 2)
    assert batch is not None
    assert ids(batch.episodes) == [2, 3]


def test_no_bound_keeps_old_episodes() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(max_policy_age=None))
    buffer.add_many(tagged(2, version=0))
    batch = buffer.sample(100, 2)
    assert batch is not None
    assert buffer.stats().sample_age_max == 100


def test_episode_already_stale_on_arrival_is_dropped_and_counted() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(max_policy_age=1))
    assert buffer.sample(5, 1) is None  # the buffer learns the trainer is at version 5
    buffer.add_many(tagged(1, version=3) + tagged(1, version=4, start=1))
    stats = buffer.stats()
    assert (stats.added, stats.evicted_stale, stats.held) == (2, 1, 1)


# ---------------------------------------------------------------------------- capacity


def test_max_buffer_size_drops_the_oldest_first() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(max_buffer_size=3, sampling="uniform"))
    buffer.add_many(tagged(3))
    buffer.add_many(tagged(2, start=3))
    assert len(buffer) == 3
    assert buffer.stats().evicted_capacity == 2
    batch = buffer.sample(0, 3)
    assert batch is not None
    assert sorted(ids(batch.episodes)) == [2, 3, 4]


def test_capacity_eviction_skips_episodes_already_gone() -> None:
    # Episode 0 is sampled (retired) first; capacity eviction must then drop 1, not 0 again.
    buffer = ReplayBuffer(ReplayBufferConfig(max_buffer_size=2))
    buffer.add_many(tagged(2))
    assert buffer.sample(0, 1) is not None
    buffer.add_many(tagged(2, start=2))
    batch = buffer.sample(0, 2)
    assert batch is not None
    assert ids(batch.episodes) == [2, 3]
    assert buffer.stats().evicted_capacity == 1


# ---------------------------------------------------------------------------- reuse


def test_use_once_by_default() -> None:
    buffer = ReplayBuffer()
    buffer.add_many(tagged(2))
    assert buffer.sample(0, 2) is not None
    assert buffer.sample(0, 1) is None
    assert buffer.stats().retired == 2


def test_max_resample_count_allows_that_many_extra_uses() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(max_resample_count=2))
    buffer.add_many(tagged(2))
    uses = []
    while (batch := buffer.sample(0, 2)) is not None:
        uses.extend(ids(batch.episodes))
    assert sorted(uses) == [0, 0, 0, 1, 1, 1]
    assert buffer.stats().retired == 2
    assert len(buffer) == 0


# ---------------------------------------------------------------------------- add_many


def test_add_many_with_one_bad_episode_adds_none() -> None:
    buffer = ReplayBuffer()
    buffer.add_many(tagged(2))
    batch: list[Any] = [*tagged(2, start=2), "not an episode", *tagged(2, start=4)]
    assert_rejected_without_change(
        buffer,
        lambda: buffer.add_many(batch),
        TypeError,
        "episodes[2] is a str, not an Episode",
    )
    assert len(buffer) == 2


def test_add_many_refuses_a_bare_episode() -> None:
    buffer = ReplayBuffer()
    assert_rejected_without_change(
        buffer,
        lambda: buffer.add_many(make_episode()),  # type: ignore[arg-type]
        TypeError,
        "use add() for one",
    )


def test_add_many_accepts_any_iterable() -> None:
    buffer = ReplayBuffer()
    buffer.add_many(e for e in tagged(3))
    assert len(buffer) == 3


# ---------------------------------------------------------------------------- stats


def test_stats_account_for_every_episode() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(max_policy_age=1, max_buffer_size=5))
    assert buffer.stats().sample_age_mean is None
    for version in range(6):
        buffer.add_many(tagged(3, version=version, start=10 * version))
        buffer.sample(version, 2)
    s = buffer.stats()
    assert s.added == 18
    assert s.added == s.held + s.evicted_stale + s.evicted_capacity + s.retired
    assert s.evicted == s.evicted_stale + s.evicted_capacity
    assert s.sampled == s.retired == 12  # use-once: sampled episodes are retired
    assert s.sample_age_max is not None
    assert s.sample_age_max <= 1


# ---------------------------------------------------------------------------- packaging


def test_importing_the_core_does_not_import_monarch() -> None:
    code = (
        "import sys, replay_buffer\n"
        "from replay_buffer import ReplayBuffer, Episode, ReplayBufferConfig\n"
        "assert not any(m == 'monarch' or m.startswith('monarch.') for m in sys.modules), "
        "'monarch was imported'\n"
        "from replay_buffer import ReplayBufferActor\n"
        "assert 'monarch' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
