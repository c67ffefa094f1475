"""A sum tree: weighted random choice among slots in O(log n), with O(log n) updates."""

from __future__ import annotations

from array import array


class SumTree:
    """Non-negative weights in `capacity` slots, each internal node the sum of its children.

    Stored as a flat array of doubles (node `i` has children `2i` and `2i + 1`, leaves start at
    `capacity`). Every internal node is recomputed from its children rather than adjusted by
    a delta, so the tree is an exact function of its leaves: no floating-point drift, and a
    tree rebuilt from the same leaves is bit-for-bit the same (which makes sampling after
    `load_state_dict` reproducible).
    """

    def __init__(self, capacity: int = 64) -> None:
        self._capacity = 1 << max(0, capacity - 1).bit_length()
        self._tree = array("d", bytes(16 * self._capacity))

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def total(self) -> float:
        return self._tree[1]

    def get(self, slot: int) -> float:
        return self._tree[self._capacity + slot]

    def set(self, slot: int, weight: float) -> None:
        tree = self._tree
        i = self._capacity + slot
        tree[i] = weight
        while i > 1:
            weight += tree[i ^ 1]  # the sibling; IEEE addition commutes, so order is moot
            i >>= 1
            tree[i] = weight

    def grow(self) -> None:
        """Doubles the capacity, keeping every slot's weight."""
        leaves = self._tree[self._capacity :]
        self._capacity *= 2
        internal = array("d", bytes(8 * self._capacity))
        self._tree = internal + leaves + array("d", bytes(8 * len(leaves)))
        self._rebuild()

    def load_leaves(self, weights: list[float]) -> None:
        """Replaces every leaf (`len(weights) == capacity`) and rebuilds the sums."""
        if len(weights) != self._capacity:
            raise ValueError(f"expected {self._capacity} leaf weights, got {len(weights)}")
        self._tree[self._capacity :] = array("d", weights)
        self._rebuild()

    def find(self, u: float) -> int:
        """The slot whose cumulative-weight interval contains `u` (`0 <= u < total`).

        Never lands on a zero-weight slot while `total > 0`: when rounding leaves `u` just
        past a subtree, the walk takes the positive child instead.
        """
        tree = self._tree
        capacity = self._capacity
        i = 1
        while i < capacity:
            i <<= 1  # the left child
            left = tree[i]
            if u >= left and tree[i + 1] > 0.0:
                u -= left
                i += 1
        return i - capacity

    def _rebuild(self) -> None:
        tree = self._tree
        for i in range(self._capacity - 1, 0, -1):
            tree[i] = tree[2 * i] + tree[2 * i + 1]
