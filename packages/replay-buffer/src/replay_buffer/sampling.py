"""Sampling policies: which held items (episodes, or whole groups) a batch takes.

A policy indexes the buffer's items by key (the buffer's arrival counter) and chooses among
them; the buffer owns the items themselves. Every operation is O(1) or O(log n) amortised
in the number of held items, never a scan, so sampling cost does not grow with the buffer.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from replay_buffer._sumtree import SumTree
from replay_buffer.config import SamplingName


@runtime_checkable
class SamplingPolicy(Protocol):
    """Chooses which held items a batch takes. Implement it to plug in your own.

    The buffer calls `insert` once per new item and `discard` once when an item leaves (used
    up, stale or dropped for capacity); `select` only ever asks for at most as many items as
    are held. Selections must depend only on the policy's history and `rng`, so that a
    policy restored with `load_state_dict` (with the buffer's RNG state) selects exactly
    what the original would have.
    """

    def insert(self, key: int, priority: float) -> None:
        """Indexes a new item. `priority` is the mean `|advantage|` of its episodes."""
        ...

    def discard(self, key: int) -> None:
        """Forgets a held item."""
        ...

    def select(self, count: int, rng: random.Random) -> list[int]:
        """`count` distinct held keys for the next batch; the items stay held."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What `load_state_dict` needs, beyond the held keys, to select identically."""
        ...

    def load_state_dict(self, state: Mapping[str, Any], priorities: Mapping[int, float]) -> None:
        """Restores from `state_dict()` output; `priorities` holds every held key (ascending)
        with the priority it was inserted with. Raises, changing nothing, if they disagree."""
        ...


class FifoSampling:
    """Oldest items first (by arrival). Deterministic; ignores priorities and `rng`."""

    def __init__(self) -> None:
        self._queue: deque[int] = deque()  # arrival order; may still hold discarded keys
        self._discarded: set[int] = set()  # removed lazily, when they reach the front

    def insert(self, key: int, priority: float) -> None:
        self._queue.append(key)

    def discard(self, key: int) -> None:
        self._discarded.add(key)
        # Keys discarded from the middle (stale, say) wait until they reach the front; compact
        # once they are most of the queue, so memory stays O(held) at O(1) amortised cost.
        if len(self._discarded) > 64 and 2 * len(self._discarded) > len(self._queue):
            self._queue = deque(k for k in self._queue if k not in self._discarded)
            self._discarded.clear()

    def select(self, count: int, rng: random.Random) -> list[int]:
        queue, discarded = self._queue, self._discarded
        chosen: list[int] = []
        while len(chosen) < count:
            key = queue.popleft()
            if key in discarded:
                discarded.remove(key)
            else:
                chosen.append(key)
        queue.extendleft(reversed(chosen))  # they stay held, at the front, in order
        return chosen

    def state_dict(self) -> dict[str, Any]:
        return {}  # the order is the ascending order of the held keys

    def load_state_dict(self, state: Mapping[str, Any], priorities: Mapping[int, float]) -> None:
        _check_state_keys(self, state, set())
        self._queue = deque(sorted(priorities))
        self._discarded = set()


class UniformSampling:
    """Uniformly random items, without replacement within a batch."""

    def __init__(self) -> None:
        self._keys: list[int] = []  # dense, so a random index is a random held key
        self._position: dict[int, int] = {}

    def insert(self, key: int, priority: float) -> None:
        self._position[key] = len(self._keys)
        self._keys.append(key)

    def discard(self, key: int) -> None:
        # Swap-remove: move the last key into the hole, O(1).
        index = self._position.pop(key)
        last = self._keys.pop()
        if last != key:
            self._keys[index] = last
            self._position[last] = index

    def select(self, count: int, rng: random.Random) -> list[int]:
        keys = self._keys
        return [keys[i] for i in rng.sample(range(len(keys)), count)]

    def state_dict(self) -> dict[str, Any]:
        return {"keys": list(self._keys)}

    def load_state_dict(self, state: Mapping[str, Any], priorities: Mapping[int, float]) -> None:
        _check_state_keys(self, state, {"keys"})
        keys = [int(k) for k in state["keys"]]
        if sorted(keys) != sorted(priorities):
            raise ValueError("UniformSampling state does not list exactly the held keys")
        self._keys = keys
        self._position = {k: i for i, k in enumerate(keys)}


_MAX_WEIGHT = 1e250


class PrioritizedSampling:
    """Items drawn with probability proportional to `(|advantage| + eps) ** alpha`, without
    replacement within a batch.

    `eps > 0` keeps items with zero advantage sampleable (they carry no policy-gradient
    signal, so they are drawn last); `alpha` tempers the skew (`0` is uniform). No
    importance weights are returned: the bias towards high-`|advantage|` episodes is the
    point of choosing this policy.
    """

    def __init__(self, *, alpha: float = 1.0, eps: float = 1e-3) -> None:
        if not alpha >= 0.0:
            raise ValueError(f"PrioritizedSampling.alpha must be >= 0, got {alpha}")
        if not eps > 0.0:
            raise ValueError(f"PrioritizedSampling.eps must be > 0, got {eps}")
        self._alpha = alpha
        self._eps = eps
        self._tree = SumTree()
        self._slot_of: dict[int, int] = {}
        self._key_at: dict[int, int] = {}
        self._free: list[int] = []  # slots given back, reused last-in first-out
        self._next_slot = 0  # slots at or above this were never used
        # Freed slots whose leaf still holds its old weight. Zeroing is deferred to the next
        # select because most freed slots are refilled by an insert before then, which saves
        # one of the three O(log n) tree walks an episode costs in steady state.
        self._unzeroed: set[int] = set()

    def insert(self, key: int, priority: float) -> None:
        if self._free:
            slot = self._free.pop()
            self._unzeroed.discard(slot)
        else:
            if self._next_slot == self._tree.capacity:
                self._tree.grow()
            slot = self._next_slot
            self._next_slot += 1
        self._slot_of[key] = slot
        self._key_at[slot] = key
        self._tree.set(slot, self._weight(priority))

    def discard(self, key: int) -> None:
        slot = self._slot_of.pop(key)
        del self._key_at[slot]
        self._unzeroed.add(slot)
        self._free.append(slot)

    def select(self, count: int, rng: random.Random) -> list[int]:
        # Draw with replacement and redraw repeats: that is exactly drawing without
        # replacement, and costs one O(log n) walk per draw while the chosen items hold a
        # small share of the weight. If repeats pile up (a few items dominate), take the
        # chosen items out of the tree instead, so redraws cannot loop; restore them after.
        tree = self._tree
        for slot in self._unzeroed:
            tree.set(slot, 0.0)
        self._unzeroed.clear()
        chosen: list[int] = []
        seen: set[int] = set()
        removed: list[tuple[int, float]] = []
        repeats = 0
        while len(chosen) < count:
            slot = tree.find(rng.random() * tree.total)
            if slot in seen:
                repeats += 1
                if repeats > count and not removed:
                    removed = [(s, tree.get(s)) for s in chosen]
                    for s in chosen:
                        tree.set(s, 0.0)
                continue
            chosen.append(slot)
            seen.add(slot)
            if removed:
                removed.append((slot, tree.get(slot)))
                tree.set(slot, 0.0)
        for slot, weight in removed:
            tree.set(slot, weight)
        return [self._key_at[slot] for slot in chosen]

    def state_dict(self) -> dict[str, Any]:
        keys = sorted(self._slot_of)
        return {
            "capacity": self._tree.capacity,
            "keys": keys,
            "slots": [self._slot_of[k] for k in keys],
            "free": list(self._free),
            "next_slot": self._next_slot,
        }

    def load_state_dict(self, state: Mapping[str, Any], priorities: Mapping[int, float]) -> None:
        _check_state_keys(self, state, {"capacity", "keys", "slots", "free", "next_slot"})
        keys = [int(k) for k in state["keys"]]
        slots = [int(s) for s in state["slots"]]
        free = [int(s) for s in state["free"]]
        next_slot, capacity = int(state["next_slot"]), int(state["capacity"])
        if keys != sorted(priorities) or len(slots) != len(keys):
            raise ValueError("PrioritizedSampling state does not list exactly the held keys")
        if sorted(slots + free) != list(range(next_slot)) or next_slot > capacity:
            raise ValueError("PrioritizedSampling state has inconsistent slots")
        tree = SumTree(capacity)
        if tree.capacity != capacity:
            raise ValueError(f"PrioritizedSampling capacity {capacity} is not a power of two")
        leaves = [0.0] * capacity
        for key, slot in zip(keys, slots, strict=True):
            leaves[slot] = self._weight(priorities[key])
        tree.load_leaves(leaves)
        self._tree = tree
        self._slot_of = dict(zip(keys, slots, strict=True))
        self._key_at = dict(zip(slots, keys, strict=True))
        self._free = free
        self._next_slot = next_slot
        self._unzeroed = set()

    def _weight(self, priority: float) -> float:
        # Capped so that even 10**50 such weights sum to a finite total.
        try:
            return min(math.pow(abs(priority) + self._eps, self._alpha), _MAX_WEIGHT)
        except OverflowError:
            return _MAX_WEIGHT


def make_policy(name: SamplingName) -> SamplingPolicy:
    """The built-in policy called `name` (`ReplayBufferConfig.sampling`), with defaults."""
    policies: dict[str, type[FifoSampling | UniformSampling | PrioritizedSampling]] = {
        "fifo": FifoSampling,
        "uniform": UniformSampling,
        "prioritized": PrioritizedSampling,
    }
    if name not in policies:
        raise ValueError(f"unknown sampling policy {name!r}; expected one of {list(policies)}")
    return policies[name]()


def _check_state_keys(policy: object, state: Mapping[str, Any], expected: set[str]) -> None:
    if set(state) != expected:
        raise ValueError(
            f"{type(policy).__name__} state must have keys {sorted(expected)}, got {sorted(state)}"
        )
