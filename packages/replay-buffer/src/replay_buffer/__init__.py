"""Versioned episode store between rollout generation and training.

The core (`ReplayBuffer` and its data types) is pure Python and imports no Monarch;
`ReplayBufferActor` serves it from a Monarch process and is imported (with Monarch) only
when first accessed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from replay_buffer.batch import SampledBatch
from replay_buffer.buffer import ReplayBuffer
from replay_buffer.columns import Columns
from replay_buffer.config import ReplayBufferConfig, SamplingName
from replay_buffer.episode import Episode, GroupId
from replay_buffer.sampling import (
    FifoSampling,
    PrioritizedSampling,
    SamplingPolicy,
    UniformSampling,
    make_policy,
)
from replay_buffer.stats import BufferStats
from replay_buffer.warmup import Warmup
from replay_buffer.wire import EpisodeBatch, columns_of

if TYPE_CHECKING:
    from replay_buffer.actor import BufferSnapshot, ReplayBufferActor

__version__ = "0.1.0"

__all__ = [
    "BufferSnapshot",
    "BufferStats",
    "Columns",
    "Episode",
    "EpisodeBatch",
    "FifoSampling",
    "GroupId",
    "PrioritizedSampling",
    "ReplayBuffer",
    "ReplayBufferActor",
    "ReplayBufferConfig",
    "SampledBatch",
    "SamplingName",
    "SamplingPolicy",
    "UniformSampling",
    "Warmup",
    "columns_of",
    "make_policy",
]


def __getattr__(name: str) -> object:
    # Lazy, so that `import replay_buffer` does not start Monarch's runtime.
    if name in ("ReplayBufferActor", "BufferSnapshot"):
        from replay_buffer import actor  # noqa: PLC0415

        return getattr(actor, name)
    raise AttributeError(f"module 'replay_buffer' has no attribute {name!r}")
