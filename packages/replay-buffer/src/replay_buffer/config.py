"""The buffer's configuration: staleness bounds, capacity, admission control, grouping."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

SamplingName = Literal["fifo", "uniform", "prioritized"]
"""The built-in sampling policies, by name (see `replay_buffer.sampling`)."""


@dataclass(frozen=True, kw_only=True)
class ReplayBufferConfig:
    """How a `ReplayBuffer` admits, keeps, evicts and samples episodes.

    All counts are in episodes and all ages in policy versions (trainer updates). Every field
    is checked on construction; a bad value raises naming the field.

    Attributes:
        max_policy_age: the staleness bound. When `sample(curr_policy_version, ...)` is
            called, every held episode with `curr_policy_version - policy_version >
            max_policy_age` is evicted first, so no sampled episode is older than this.
            `0` means strictly on-policy; `None` means no bound. An episode that arrives
            already older than the bound (relative to the last version passed to `sample`)
            is dropped on arrival and counted as evicted.
        max_buffer_size: the most episodes held; adding beyond it drops the oldest (by
            arrival) first. `None` means unbounded.
        max_resample_count: how many times an episode may be sampled again after its first
            use; `0` means each episode is used once, then retired.
        admission_limit: the most episodes held before `put` / `wait_for_room` make
            producers wait, so generators slow down instead of producing work that will be
            evicted. `None` means never wait. Must not exceed `max_buffer_size`.
        group_size: when set, episodes are kept, evicted and sampled in whole groups of
            exactly this many episodes sharing a `group_id` (GRPO); groups must be added
            whole, in one `add_many` / `put` call. `batch_size` passed to `sample` counts
            episodes and must be a multiple of `group_size * dp_size`, so every
            data-parallel shard holds whole groups. `None` means episodes are independent.
        dp_size: number of data-parallel shards each sampled batch is split into; the
            `batch_size` passed to `sample` must be a multiple of it.
        sampling: which held episodes (or groups) a batch takes: `"fifo"` (oldest first;
            the default, because with use-once sampling and a staleness bound it lets the
            fewest episodes go stale unused), `"uniform"` (uniformly at random, without
            replacement) or `"prioritized"` (probability proportional to `|advantage|`).
        seed: seed of the buffer's random number generator (saved by `state_dict`).
    """

    max_policy_age: int | None = None
    max_buffer_size: int | None = None
    max_resample_count: int = 0
    admission_limit: int | None = None
    group_size: int | None = None
    dp_size: int = 1
    sampling: SamplingName = "fifo"
    seed: int = 0

    def __post_init__(self) -> None:
        _check_int("max_policy_age", self.max_policy_age, minimum=0, optional=True)
        _check_int("max_buffer_size", self.max_buffer_size, minimum=1, optional=True)
        _check_int("max_resample_count", self.max_resample_count, minimum=0)
        _check_int("admission_limit", self.admission_limit, minimum=1, optional=True)
        _check_int("group_size", self.group_size, minimum=1, optional=True)
        _check_int("dp_size", self.dp_size, minimum=1)
        _check_int("seed", self.seed, minimum=None)
        if self.sampling not in get_args(SamplingName):
            raise ValueError(
                f"ReplayBufferConfig.sampling must be one of {get_args(SamplingName)}, "
                f"got {self.sampling!r}"
            )
        size, limit, group = self.max_buffer_size, self.admission_limit, self.group_size
        if size is not None and limit is not None and limit > size:
            raise ValueError(
                f"ReplayBufferConfig.admission_limit ({limit}) must not exceed "
                f"max_buffer_size ({size}): the buffer would drop episodes before it ever "
                "made a producer wait"
            )
        for name, bound in (("max_buffer_size", size), ("admission_limit", limit)):
            if group is not None and bound is not None and bound < group:
                raise ValueError(
                    f"ReplayBufferConfig.{name} ({bound}) must be at least group_size "
                    f"({group}), or no whole group could ever be held"
                )

    @property
    def episodes_per_item(self) -> int:
        """Episodes in one unit of storage and sampling: `group_size`, or 1 ungrouped."""
        return self.group_size or 1


def _check_int(name: str, value: object, *, minimum: int | None, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        expected = "an int or None" if optional else "an int"
        raise TypeError(f"ReplayBufferConfig.{name} must be {expected}, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"ReplayBufferConfig.{name} must be >= {minimum}, got {value}")
