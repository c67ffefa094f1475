"""Counters that show how the buffer is used: flow of episodes and age of what is sampled."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True, kw_only=True)
class BufferStats:
    """A snapshot of a buffer's counters since it was created (or restored).

    All counts are in episodes; ages are in policy versions (`curr_policy_version -
    policy_version` at the moment of sampling). Every episode ever added is accounted for:
    `added == held + evicted_stale + evicted_capacity + retired`.

    Attributes:
        added: episodes accepted by `add` / `add_many` / `put`, including any dropped at once
            for being too stale.
        sampled: episodes returned by `sample`, counting an episode again each time it is
            resampled.
        evicted_stale: episodes dropped for exceeding `max_policy_age`.
        evicted_capacity: episodes dropped, oldest first, to stay within `max_buffer_size`.
        retired: episodes removed after their last allowed use (`max_resample_count`).
        held: episodes held now.
        sample_age_min: youngest age among sampled episodes; None before the first sample.
        sample_age_mean: mean age over every sampled episode; None before the first sample.
        sample_age_max: oldest age among sampled episodes; None before the first sample.
    """

    added: int
    sampled: int
    evicted_stale: int
    evicted_capacity: int
    retired: int
    held: int
    sample_age_min: int | None
    sample_age_mean: float | None
    sample_age_max: int | None

    @property
    def evicted(self) -> int:
        """Episodes dropped unused or under-used: stale plus capacity evictions."""
        return self.evicted_stale + self.evicted_capacity


@dataclass(kw_only=True, slots=True)
class Counters:
    """The mutable running totals behind `BufferStats` (internal to the buffer)."""

    added: int = 0
    sampled: int = 0
    evicted_stale: int = 0
    evicted_capacity: int = 0
    retired: int = 0
    age_sum: int = 0
    age_min: int | None = None
    age_max: int | None = None

    def record_ages(self, ages: list[int]) -> None:
        if not ages:
            return
        self.sampled += len(ages)
        self.age_sum += sum(ages)
        lo, hi = min(ages), max(ages)
        self.age_min = lo if self.age_min is None else min(self.age_min, lo)
        self.age_max = hi if self.age_max is None else max(self.age_max, hi)

    def snapshot(self, held: int) -> BufferStats:
        return BufferStats(
            added=self.added,
            sampled=self.sampled,
            evicted_stale=self.evicted_stale,
            evicted_capacity=self.evicted_capacity,
            retired=self.retired,
            held=held,
            sample_age_min=self.age_min,
            sample_age_mean=self.age_sum / self.sampled if self.sampled else None,
            sample_age_max=self.age_max,
        )

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Counters:
        names = {f.name for f in fields(cls)}
        if set(state) != names:
            raise ValueError(f"counters must have keys {sorted(names)}, got {sorted(state)}")
        for name, value in state.items():
            optional = name in ("age_min", "age_max")
            if not (value is None and optional) and (
                isinstance(value, bool) or not isinstance(value, int)
            ):
                raise ValueError(f"counter {name!r} must be an int, got {value!r}")
        return cls(**state)
