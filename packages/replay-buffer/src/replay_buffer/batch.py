"""What `ReplayBuffer.sample` returns: one training batch, split for data parallelism."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from replay_buffer.episode import Episode
from replay_buffer.wire import pack, unpack


@dataclass(frozen=True, eq=False)
class SampledBatch:
    """A batch of episodes, already split into `dp_size` equal shards.

    Attributes:
        shards: `dp_size` tuples of `batch_size // dp_size` episodes each; shard `r` is for
            data-parallel rank `r`. When the buffer keeps groups whole, every group sits
            entirely in one shard, its members next to each other.
        curr_policy_version: the version passed to `sample`; each episode's age is
            `curr_policy_version - episode.policy_version`, at most `max_policy_age`.

    It pickles as one columnar record of all its episodes (`wire.py`).
    """

    shards: tuple[tuple[Episode, ...], ...]
    curr_policy_version: int

    @property
    def episodes(self) -> tuple[Episode, ...]:
        """Every episode of the batch, shard after shard."""
        return tuple(episode for shard in self.shards for episode in shard)

    @property
    def dp_size(self) -> int:
        return len(self.shards)

    def __len__(self) -> int:
        return sum(len(shard) for shard in self.shards)

    def __reduce__(self) -> tuple[Any, ...]:
        sizes = [len(shard) for shard in self.shards]
        return (_rebuild, (pack(self.episodes), sizes, self.curr_policy_version))


def _rebuild(packed: tuple[Any, ...], sizes: list[int], version: int) -> SampledBatch:
    episodes, shards, start = unpack(packed), [], 0
    for size in sizes:
        shards.append(episodes[start : start + size])
        start += size
    return SampledBatch(tuple(shards), version)
