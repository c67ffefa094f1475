"""Property tests: random interleavings of adds, samples and checkpoints keep every rule.

A hypothesis state machine drives a buffer (random config and policy) through adds from
lagging producers, samples at advancing versions, and checkpoint restores into a twin that
must from then on behave identically. After every step it checks:
- no sampled episode is older than `max_policy_age`;
- no episode is sampled more than `max_resample_count + 1` times (use-once: never twice);
- groups come out whole; the buffer never holds more than `max_buffer_size`;
- the stats account for every episode added.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from replay_buffer import Episode, ReplayBuffer, ReplayBufferConfig, SampledBatch
from replay_buffer.testing import make_episode, states_equal

configs = st.builds(
    ReplayBufferConfig,
    max_policy_age=st.none() | st.integers(0, 3),
    max_buffer_size=st.none() | st.integers(6, 40),
    max_resample_count=st.integers(0, 2),
    group_size=st.none() | st.integers(1, 3),
    dp_size=st.integers(1, 2),
    sampling=st.sampled_from(["fifo", "uniform", "prioritized"]),
    seed=st.integers(0, 2**32),
)


class BufferMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.buffer = ReplayBuffer()
        self.twin: ReplayBuffer | None = None  # restored from a checkpoint; must match
        self.version = 0
        self.next_id = 0
        self.next_group = 0
        self.uses: Counter[int] = Counter()

    @initialize(config=configs)
    def start(self, config: ReplayBufferConfig) -> None:
        self.buffer = ReplayBuffer(config)

    @property
    def config(self) -> ReplayBufferConfig:
        return self.buffer.config

    @rule(
        lags=st.lists(st.integers(0, 5), min_size=1, max_size=6),
        advantages=st.lists(st.floats(-3, 3), min_size=3, max_size=3),
    )
    def add(self, lags: list[int], advantages: list[float]) -> None:
        """A few producers each add one episode (or one whole group), lagging behind."""
        episodes: list[Episode] = []
        for lag in lags:
            version = max(0, self.version - lag)
            group = self.next_group if self.config.group_size else None
            self.next_group += 1
            for i in range(self.config.group_size or 1):
                episodes.append(
                    make_episode(
                        policy_version=version,
                        advantage=advantages[i % 3],
                        group_id=group,
                        metadata={"id": self.next_id},
                    )
                )
                self.next_id += 1
        self.buffer.add_many(episodes)
        if self.twin is not None:
            # The twin gets equal, not identical, episodes: it must not rely on identity.
            self.twin.add_many(
                make_episode(
                    policy_version=e.policy_version,
                    advantage=e.advantage,
                    group_id=e.group_id,
                    metadata=dict(e.metadata),
                )
                for e in episodes
            )

    @rule(advance=st.integers(0, 2), units=st.integers(1, 2))
    def sample(self, advance: int, units: int) -> None:
        self.version += advance
        batch_size = units * self.config.episodes_per_item * self.config.dp_size
        if self.config.max_buffer_size is not None and batch_size > self.config.max_buffer_size:
            return
        batch = self.buffer.sample(self.version, batch_size)
        if self.twin is not None:
            assert ids(self.twin.sample(self.version, batch_size)) == ids(batch)
            event(f"twin compared: {'a batch' if batch else 'None'}")
        event(f"sample: {'a batch' if batch else 'None'} ({self.config.sampling})")
        if batch is None:
            return
        assert len(batch) == batch_size
        assert batch.dp_size == self.config.dp_size
        for episode in batch.episodes:
            age = self.version - episode.policy_version
            bound = self.config.max_policy_age
            assert bound is None or age <= bound, f"sampled an episode of age {age} > {bound}"
            self.uses[episode.metadata["id"]] += 1
            assert self.uses[episode.metadata["id"]] <= self.config.max_resample_count + 1
        if self.config.group_size is not None:
            for shard in batch.shards:
                for start in range(0, len(shard), self.config.group_size):
                    members = shard[start : start + self.config.group_size]
                    assert len({e.group_id for e in members}) == 1

    @precondition(lambda self: len(self.buffer) > 0)
    @rule()
    def checkpoint(self) -> None:
        """Restores a checkpoint into a fresh twin; an existing twin must match exactly."""
        state = self.buffer.state_dict()
        if self.twin is not None:
            assert states_equal(self.twin.state_dict(), state)
        twin = ReplayBuffer(self.config)
        twin.load_state_dict(state)
        assert states_equal(twin.state_dict(), state)
        self.twin = twin

    @invariant()
    def within_capacity_and_accounted(self) -> None:
        stats = self.buffer.stats()
        size = self.config.max_buffer_size
        assert size is None or stats.held <= size
        assert stats.added == stats.held + stats.evicted + stats.retired
        assert stats.held == len(self.buffer)
        if self.twin is not None:
            assert self.twin.stats() == stats


def ids(batch: SampledBatch | None) -> list[int] | None:
    return None if batch is None else [e.metadata["id"] for e in batch.episodes]


BufferMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestBufferRulesUnderRandomInterleavings = BufferMachine.TestCase
