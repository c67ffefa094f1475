"""What `ReplayBuffer.sample` returns: one training batch, split for data parallelism."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from replay_buffer.episode import Episode
from replay_buffer.wire import EpisodeBatch


class SampledBatch:
    """A batch of episodes, already split into `dp_size` equal shards.

    Attributes:
        shards: `dp_size` tuples of `batch_size // dp_size` episodes each; shard `r` is for
            data-parallel rank `r`. When the buffer keeps groups whole, every group sits
            entirely in one shard, its members next to each other.
        curr_policy_version: the version passed to `sample`; each episode's age is
            `curr_policy_version - episode.policy_version`, at most `max_policy_age`.
        batch: every episode, shard after shard, as one `EpisodeBatch`.

    It pickles as one columnar record of all its episodes (`wire.py`). Unpickled, it makes
    no `Episode` until `shards` or `episodes` is read: a process that passes the batch on
    (`batch`, sent again) or reads it field by field (`batch.columns()`,
    `batch.group_ids()`) sends the same record and never unpacks it. Read-only; equality is
    identity.
    """

    __slots__ = ("_batch", "_shards", "_sizes", "_version")

    def __init__(self, shards: Sequence[Sequence[Episode]], curr_policy_version: int) -> None:
        self._shards: tuple[tuple[Episode, ...], ...] | None = tuple(tuple(s) for s in shards)
        self._sizes = [len(shard) for shard in self._shards]
        self._batch: EpisodeBatch | None = None
        self._version = curr_policy_version

    @property
    def curr_policy_version(self) -> int:
        return self._version

    @property
    def shards(self) -> tuple[tuple[Episode, ...], ...]:
        if self._shards is None:
            assert self._batch is not None
            episodes, shards, start = tuple(self._batch), [], 0
            for size in self._sizes:
                shards.append(episodes[start : start + size])
                start += size
            self._shards = tuple(shards)
        return self._shards

    @property
    def batch(self) -> EpisodeBatch:
        """Every episode of the batch, shard after shard, as one `EpisodeBatch` (the record
        the batch arrived as, when it was unpickled)."""
        if self._batch is None:
            self._batch = EpisodeBatch(self.episodes)
        return self._batch

    @property
    def episodes(self) -> tuple[Episode, ...]:
        """Every episode of the batch, shard after shard."""
        return tuple(episode for shard in self.shards for episode in shard)

    @property
    def dp_size(self) -> int:
        return len(self._sizes)

    def __len__(self) -> int:
        return sum(self._sizes)

    def __repr__(self) -> str:
        return f"SampledBatch({self._sizes} episodes, curr_policy_version={self._version})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.batch, self._sizes, self._version))


def _rebuild(batch: EpisodeBatch, sizes: list[int], version: int) -> SampledBatch:
    sampled = SampledBatch.__new__(SampledBatch)
    sampled._batch, sampled._shards, sampled._sizes, sampled._version = batch, None, sizes, version
    return sampled
