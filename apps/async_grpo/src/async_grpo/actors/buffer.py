"""The replay buffer actor: the package's `ReplayBufferActor`, its waits traced.

When tracing is on it records how long each producer waited for room, how long each put
took, how long the trainer's request waited for a batch, and the number of episodes held (a
counter track). It runs as a one-replica service (`launch/spawn.py`): a buffer process
that dies is started again, empty, and the controller generates again what it held (its
ledger knows which groups those were; every `put` answers with the `incarnation` that took
it). Checkpoints take its `snapshot`; a rollback `restore`s one.
"""

from __future__ import annotations

import contextlib
from typing import Any

from replay_buffer import ReplayBufferActor, ReplayBufferConfig

from async_grpo import tracing
from async_grpo.actors.cores import ProcessSetup, settle_heap, share_cores


class BufferActor(ReplayBufferActor):
    """Serves one `ReplayBuffer` built from `config`; every endpoint is concurrent (a `put`
    waiting for room must not block the `sample_wait` that makes room, nor the other way
    round)."""

    def __init__(self, config: ReplayBufferConfig, setup: ProcessSetup | None = None) -> None:
        share_cores(setup, "buffer")
        super().__init__(config)
        tracing.start_from_env("buffer")
        settle_heap()

    def _traced(
        self, name: str, *, track: str, wait: bool = False, **args: Any
    ) -> contextlib.AbstractContextManager[Any]:
        return tracing.span(name, track=track, wait=wait, **args)

    def _held(self, episodes: int) -> None:
        tracing.counter("buffer", episodes=episodes)
