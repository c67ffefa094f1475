"""`ReplayBuffer`: the store between rollout generation and training (pure Python)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable, Mapping
from typing import Any

from replay_buffer import _state
from replay_buffer._admission import Waiters
from replay_buffer._store import ArrivalOrder, Item, VersionOrder
from replay_buffer.batch import SampledBatch
from replay_buffer.config import ReplayBufferConfig
from replay_buffer.episode import Episode, GroupId, check_version
from replay_buffer.sampling import SamplingPolicy, make_policy
from replay_buffer.stats import BufferStats, Counters


class ReplayBuffer:
    """Holds episodes tagged with policy versions and hands the trainer batches of fresh ones.

    Producers (generators) `add` / `add_many` episodes, or `put` them, which first waits
    while the buffer is at its `admission_limit`. The trainer calls `sample(version,
    batch_size)`, which evicts what has become too stale for `version` and returns a
    `SampledBatch`, or None while too few fresh episodes are held. See `ReplayBufferConfig`
    for every rule.

    Every call that raises (bad episode, inconsistent batch size, a policy version going
    back, a malformed state_dict) does so before changing anything. Costs are O(1) or
    O(log n) amortised per episode in the number held (no scans), so the buffer sustains
    well over 10^5 episodes per second in one process.

    Not thread-safe: use it from one thread. `put` / `wait_for_room` / `sample_wait` are
    coroutines that must run on the event loop of the thread that calls `sample` (as they do
    inside `ReplayBufferActor`).
    """

    def __init__(
        self, config: ReplayBufferConfig | None = None, *, policy: SamplingPolicy | None = None
    ) -> None:
        """`policy`, when given, replaces the built-in policy named by `config.sampling`."""
        config = ReplayBufferConfig() if config is None else config
        if not isinstance(config, ReplayBufferConfig):
            raise TypeError(f"config must be a ReplayBufferConfig, got {type(config).__name__}")
        if policy is None:
            policy = make_policy(config.sampling)
        elif not isinstance(policy, SamplingPolicy):
            raise TypeError(f"policy must implement SamplingPolicy, got {type(policy).__name__}")
        self._config = config
        self._policy = policy
        self._rng = random.Random(config.seed)
        self._items: dict[int, Item] = {}  # by key, in arrival order
        self._group_keys: dict[GroupId | None, int] = {}  # held group ids (grouped only)
        self._arrival = ArrivalOrder()
        self._versions = VersionOrder()
        self._next_key = 0
        self._held = 0  # episodes in self._items
        self._last_version: int | None = None  # the latest version passed to sample()
        self._counters = Counters()
        self._room = Waiters()  # producers waiting for room
        self._arrivals = Waiters()  # trainers waiting for a batch

    @property
    def config(self) -> ReplayBufferConfig:
        return self._config

    def __len__(self) -> int:
        """Episodes held now."""
        return self._held

    # ------------------------------------------------------------------ producers

    def add(self, episode: Episode) -> None:
        """Adds one episode (a grouped buffer only accepts whole groups: use `add_many`)."""
        self.add_many((episode,))

    def add_many(self, episodes: Iterable[Episode]) -> None:
        """Adds episodes in order, all or none: one bad episode rejects the whole call.

        Never waits. Episodes already older than `max_policy_age` (relative to the last
        version passed to `sample`) are dropped and counted as evicted; adding past
        `max_buffer_size` drops the oldest held episodes (or groups) first.
        """
        self._store(self._check_new(episodes))
        self._arrivals.wake_all()

    def has_room(self, count: int = 1) -> bool:
        """True if `count` more episodes fit under `admission_limit` now."""
        limit = self._config.admission_limit
        return limit is None or self._held + count <= limit

    async def wait_for_room(self, count: int = 1) -> None:
        """Waits until `count` more episodes fit under `admission_limit` (at once if none).

        Call it before producing work to pace a producer; another producer may take the room
        before this one adds, so use `put` to wait and add as one step.
        """
        self._check_room_request(count)
        while not self.has_room(count):
            await self._room.wait()

    async def put(self, episodes: Iterable[Episode]) -> None:
        """Waits until all of `episodes` fit under `admission_limit`, then adds them.

        Episodes are checked before waiting, so bad input fails at once; the wait and the
        add happen with no suspension point in between, so the room found is the room used.
        """
        episodes = tuple(episodes)
        self._check_new(episodes)
        await self.wait_for_room(len(episodes))
        self.add_many(episodes)  # checks again: a group id may have arrived meanwhile

    # ------------------------------------------------------------------ the trainer

    def sample(self, curr_policy_version: int, batch_size: int) -> SampledBatch | None:
        """Evicts episodes too stale for `curr_policy_version`, then returns `batch_size`
        episodes chosen by the sampling policy, split into `dp_size` shards; or None (after
        the eviction) if fewer than `batch_size` fresh episodes are held.

        `curr_policy_version` is the trainer's current version: an int >= 0 that never
        decreases from one call to the next. `batch_size` counts episodes; it must be a
        positive multiple of `dp_size` (of `group_size * dp_size` for a grouped buffer) and
        at most `max_buffer_size` and `admission_limit`, or no batch could ever be formed.
        Sampled episodes are retired after their last allowed use (`max_resample_count`).
        An episode's age is `curr_policy_version - policy_version`; it is negative only if
        the caller passes a version older than the weights that produced the episode.
        """
        check_version("curr_policy_version", curr_policy_version)
        if self._last_version is not None and curr_policy_version < self._last_version:
            raise ValueError(
                f"curr_policy_version {curr_policy_version} is lower than "
                f"{self._last_version}, passed to an earlier sample(): versions never go back"
            )
        count = self._items_per_batch(batch_size)

        self._last_version = curr_policy_version
        evicted = self._evict_stale()
        if len(self._items) < count:
            if evicted:
                self._room.wake_all()
            return None

        keys = self._policy.select(count, self._rng)
        if len(keys) != count or len(set(keys)) != count or not all(k in self._items for k in keys):
            raise RuntimeError(
                f"{type(self._policy).__name__}.select returned {keys!r}: expected {count} "
                "distinct held keys"
            )
        episodes: list[Episode] = []
        for key in keys:
            item = self._items[key]
            episodes.extend(item.episodes)
            item.times_sampled += 1
            if item.times_sampled > self._config.max_resample_count:
                self._counters.retired += self._remove(key)
        self._counters.record_ages([curr_policy_version - e.policy_version for e in episodes])
        self._room.wake_all()

        per_shard = batch_size // self._config.dp_size
        shards = tuple(
            tuple(episodes[start : start + per_shard]) for start in range(0, batch_size, per_shard)
        )
        return SampledBatch(shards=shards, curr_policy_version=curr_policy_version)

    async def sample_wait(
        self,
        curr_policy_version: int,
        batch_size: int,
        timeout: float | None = None,  # noqa: ASYNC109 (mirrors the actor endpoint's)
    ) -> SampledBatch | None:
        """`sample`, retried each time episodes arrive until it returns a batch; None only
        once `timeout` seconds (None: no limit) pass without one.

        A trainer calls this instead of polling `sample`: it resumes as soon as the episode
        that completes a batch is added, with no sleep granularity and no extra round trips.
        A batch is never lost to the timeout or to cancellation: both can only land while
        waiting, never between taking a batch and returning it.
        """
        if timeout is not None and not timeout >= 0:
            raise ValueError(f"timeout must be None or a number >= 0, got {timeout!r}")
        try:
            async with asyncio.timeout(timeout):
                while (batch := self.sample(curr_policy_version, batch_size)) is None:
                    await self._arrivals.wait()
                return batch
        except TimeoutError:
            return None

    def stats(self) -> BufferStats:
        return self._counters.snapshot(held=self._held)

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly: held episodes with their use counts, the
        policy's index, the RNG state, the last version seen and the counters. The tensors
        are the episodes' own (not copies). Plain containers only, so `torch.save` and
        `torch.load(weights_only=True)` round-trip it (unless episodes carry exotic metadata).
        """
        return _state.encode(
            config=self._config,
            policy_type=_type_name(self._policy),
            policy_state=self._policy.state_dict(),
            rng=self._rng,
            next_key=self._next_key,
            last_version=self._last_version,
            items=self._items,
            counters=self._counters,
        )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replaces the whole content with `state` (from `state_dict()` of a buffer with the
        same config and policy type); afterwards this buffer samples exactly as the saved one
        would have. Raises `ValueError`, changing nothing, if `state` does not fit."""
        restored = _state.decode(state, config=self._config, policy_type=_type_name(self._policy))
        held = sum(len(item.episodes) for item in restored.items.values())
        size = self._config.max_buffer_size
        if size is not None and held > size:
            raise ValueError(f"state_dict holds {held} episodes, over max_buffer_size {size}")
        # The policy loads last and is atomic itself, so any failure leaves us unchanged.
        self._policy.load_state_dict(
            restored.policy_state, {k: item.priority for k, item in restored.items.items()}
        )
        self._items = restored.items
        self._arrival = ArrivalOrder()
        self._versions = VersionOrder()
        for key, item in self._items.items():
            if self._config.max_buffer_size is not None:
                self._arrival.append(key, self._items)
            if self._config.max_policy_age is not None:
                self._versions.push(item.version, key, self._items)
        self._group_keys = (
            {item.episodes[0].group_id: k for k, item in self._items.items()}
            if self._config.group_size is not None
            else {}
        )
        self._rng = restored.rng
        self._next_key = restored.next_key
        self._held = held
        self._last_version = restored.last_version
        self._counters = restored.counters
        self._room.wake_all()
        self._arrivals.wake_all()

    # ------------------------------------------------------------------ internals

    def _check_new(self, episodes: Iterable[Episode]) -> list[tuple[Episode, ...]]:
        """The episodes as storage items (one each, or whole groups); raises if any is bad."""
        if isinstance(episodes, Episode):
            raise TypeError("add_many/put take an iterable of Episode; use add() for one")
        episodes = tuple(episodes)
        for i, episode in enumerate(episodes):
            if not isinstance(episode, Episode):
                raise TypeError(f"episodes[{i}] is a {type(episode).__name__}, not an Episode")
        group_size = self._config.group_size
        if group_size is None:
            return [(episode,) for episode in episodes]
        groups: dict[GroupId, list[Episode]] = {}
        for i, episode in enumerate(episodes):
            if episode.group_id is None:
                raise ValueError(
                    f"episodes[{i}].group_id is None, but this buffer keeps groups of "
                    f"group_size={group_size} whole: give each episode its group's id"
                )
            groups.setdefault(episode.group_id, []).append(episode)
        for group_id, members in groups.items():
            if len(members) != group_size:
                raise ValueError(
                    f"group_id={group_id!r} has {len(members)} episodes in this call, expected "
                    f"group_size={group_size}: add each group whole, in one call"
                )
            if group_id in self._group_keys:
                raise ValueError(f"group_id={group_id!r} is already held; group ids must be unique")
        return [tuple(members) for members in groups.values()]

    def _store(self, new_items: list[tuple[Episode, ...]]) -> None:
        counters, items, policy = self._counters, self._items, self._policy
        grouped = self._config.group_size is not None
        track_versions = self._config.max_policy_age is not None
        max_size = self._config.max_buffer_size
        stale_before = self._stale_before()
        for episodes in new_items:
            n = len(episodes)
            item = Item.of(episodes)
            counters.added += n
            if stale_before is not None and item.version < stale_before:
                counters.evicted_stale += n
                continue
            key = self._next_key
            self._next_key = key + 1
            items[key] = item
            policy.insert(key, item.priority)
            self._held += n
            if grouped:
                self._group_keys[episodes[0].group_id] = key
            if track_versions:
                self._versions.push(item.version, key, items)
            if max_size is not None:
                self._arrival.append(key, items)
                while self._held > max_size:
                    oldest = self._arrival.pop_oldest(items)
                    counters.evicted_capacity += self._remove(oldest)

    def _remove(self, key: int) -> int:
        """Forgets a held item; returns how many episodes it held."""
        item = self._items.pop(key)
        self._policy.discard(key)
        self._held -= len(item.episodes)
        if self._config.group_size is not None:
            del self._group_keys[item.episodes[0].group_id]
        return len(item.episodes)

    def _stale_before(self) -> int | None:
        """Held versions below this are too stale for the latest sampled version."""
        if self._config.max_policy_age is None or self._last_version is None:
            return None
        return self._last_version - self._config.max_policy_age

    def _evict_stale(self) -> int:
        stale_before = self._stale_before()
        if stale_before is None:
            return 0
        evicted = 0
        for key in self._versions.pop_older_than(stale_before, self._items):
            evicted += self._remove(key)
        self._counters.evicted_stale += evicted
        return evicted

    def _items_per_batch(self, batch_size: int) -> int:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int):
            raise TypeError(f"batch_size must be an int, got {type(batch_size).__name__}")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        config = self._config
        unit = config.episodes_per_item * config.dp_size
        if batch_size % unit:
            what = (
                f"group_size*dp_size={config.group_size}*{config.dp_size} so that every "
                "data-parallel shard holds whole groups"
                if config.group_size is not None
                else f"dp_size={config.dp_size}"
            )
            raise ValueError(f"batch_size {batch_size} must be a multiple of {what}")
        for name, bound in (
            ("max_buffer_size", config.max_buffer_size),
            ("admission_limit", config.admission_limit),
        ):
            if bound is not None and batch_size > bound:
                raise ValueError(
                    f"batch_size {batch_size} exceeds {name}={bound}: the buffer could never "
                    "hold a whole batch"
                )
        return batch_size // config.episodes_per_item

    def _check_room_request(self, count: object) -> None:
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"count must be an int >= 0, got {count!r}")
        limit = self._config.admission_limit
        if limit is not None and count > limit:
            raise ValueError(
                f"{count} episodes can never fit under admission_limit={limit}; "
                "put them in smaller calls"
            )


def _type_name(obj: object) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"
