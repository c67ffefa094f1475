"""The buffer's storage: items (an episode, or a whole group) and the two orders it evicts by.

Both orders delete lazily: removing an item only drops it from the `items` dict, and an
index skips keys that are no longer there when it next walks past them. Each index is
rebuilt from `items` once most of its keys are gone, so memory stays O(held) and every
operation is O(1) (arrival) or O(log n) (versions) amortised, never a scan per call.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from replay_buffer.episode import Episode

_SLACK = 64  # stale index entries tolerated before a rebuild is worth its O(n) cost


@dataclass(slots=True)
class Item:
    """The unit of storage and sampling: one episode, or a whole group kept together."""

    episodes: tuple[Episode, ...]
    version: int  # the oldest member's policy_version: it decides the group's staleness
    priority: float  # mean |advantage| of the members, for prioritized sampling
    times_sampled: int = 0

    @classmethod
    def of(cls, episodes: tuple[Episode, ...], times_sampled: int = 0) -> Item:
        if len(episodes) == 1:  # the ungrouped hot path
            (e,) = episodes
            return cls(episodes, e.policy_version, abs(e.advantage), times_sampled)
        return cls(
            episodes,
            min(e.policy_version for e in episodes),
            sum(abs(e.advantage) for e in episodes) / len(episodes),
            times_sampled,
        )


class ArrivalOrder:
    """Keys oldest-first by arrival, for dropping the oldest when over capacity."""

    def __init__(self) -> None:
        self._keys: deque[int] = deque()

    def append(self, key: int, items: dict[int, Item]) -> None:
        self._keys.append(key)
        if len(self._keys) > 2 * len(items) + _SLACK:
            self._keys = deque(items)  # dicts keep insertion (= arrival) order

    def pop_oldest(self, items: dict[int, Item]) -> int:
        """Removes and returns the oldest held key (`items` must not be empty)."""
        while True:
            key = self._keys.popleft()
            if key in items:
                return key


class VersionOrder:
    """Keys by policy version, for evicting everything older than a threshold."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int]] = []

    def push(self, version: int, key: int, items: dict[int, Item]) -> None:
        heapq.heappush(self._heap, (version, key))
        if len(self._heap) > 2 * len(items) + _SLACK:
            self._heap = [(item.version, k) for k, item in items.items()]
            heapq.heapify(self._heap)

    def pop_older_than(self, version: int, items: dict[int, Item]) -> Iterator[int]:
        """Yields, and forgets, every held key whose version is below `version`."""
        heap = self._heap
        while heap and heap[0][0] < version:
            _, key = heapq.heappop(heap)
            if key in items:
                yield key
