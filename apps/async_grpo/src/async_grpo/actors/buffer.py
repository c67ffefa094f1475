"""The replay buffer actor: a `replay_buffer.ReplayBuffer` in its own process, its waits
traced, restorable in place.

When tracing is on it records how long each producer waited for room, how long each put
took, how long the trainer's request waited for a batch, and the number of episodes held (a
counter track). It runs as a one-replica service (`launch/spawn.py`): a buffer process that
dies is started again, empty, and the controller generates again what it held (its ledger
knows which groups those were; every `put` answers with the `incarnation` that took it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from collections.abc import Iterator
from typing import Any

from monarch.actor import Actor
from monarch.actor.concurrent import concurrent_endpoint
from replay_buffer import Episode, ReplayBuffer, ReplayBufferConfig, SampledBatch

from async_grpo import tracing


@dataclasses.dataclass(frozen=True)
class BufferSnapshot:
    """The buffer at one instant: its `state_dict` (`ReplayBuffer.state_dict`), and the
    groups it holds as (group id, oldest policy version among the group's episodes)."""

    state: dict[str, Any]
    groups: tuple[tuple[int, int], ...]


class BufferActor(Actor):
    """Serves one `ReplayBuffer` built from `config`. Every endpoint is concurrent, as the
    package's `ReplayBufferActor`: a `put` waiting for room must not block the `sample_wait`
    that makes room, nor the other way round."""

    def __init__(self, config: ReplayBufferConfig) -> None:
        tracing.start_from_env("buffer")
        self._config = config
        self._buffer = ReplayBuffer(config)
        # Tells this process's buffer from the one a restart would bring: a put answered by
        # a buffer that then died is lost with it.
        self.incarnation = f"{os.getpid()}-{id(self):x}"
        self._waiting: set[asyncio.Task[Any]] = set()

    @concurrent_endpoint
    async def put(self, episodes: list[Episode]) -> str:
        """Returns once the episodes are added, after waiting for room if needed; answers
        with the incarnation that holds them."""
        n = len(episodes)
        with self._tracked():
            with tracing.span("wait_for_room", track="put", wait=True, episodes=n):
                await self._buffer.wait_for_room(n)
            with tracing.span("put", track="put", episodes=n):
                await self._buffer.put(episodes)  # at once, unless another took the room
        tracing.counter("buffer", episodes=len(self._buffer))
        return self.incarnation

    @concurrent_endpoint
    async def sample_wait(
        self,
        curr_policy_version: int,
        batch_size: int,
        # A caller cannot cancel the wait in this process: the bound has to travel with it.
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> SampledBatch | None:
        """A batch for the trainer at `curr_policy_version` as soon as one can be formed, or
        None after `timeout` seconds."""
        span = tracing.span("sample_wait", track="sample", wait=True, version=curr_policy_version)
        with self._tracked(), span as s:
            batch = await self._buffer.sample_wait(curr_policy_version, batch_size, timeout)
            s.set(got=batch is not None)
        tracing.counter("buffer", episodes=len(self._buffer))
        return batch

    @concurrent_endpoint
    async def sample(self, curr_policy_version: int, batch_size: int) -> SampledBatch | None:
        """A batch now, or None (see `ReplayBuffer.sample`)."""
        return self._buffer.sample(curr_policy_version, batch_size)

    @concurrent_endpoint
    async def snapshot(self) -> BufferSnapshot:
        """The buffer's whole state, taken atomically (no put or sample in between)."""
        state = self._buffer.state_dict()
        groups = [
            (int(eps[0]["group_id"]), min(int(e["policy_version"]) for e in eps))
            for eps in (item["episodes"] for item in state["items"])
        ]
        return BufferSnapshot(state, tuple(groups))

    @concurrent_endpoint
    async def restore(self, state: dict[str, Any] | None) -> None:
        """Replaces the content with `state` (None: empty, as new), after cancelling every
        put and sample still waiting: their callers (a rollout, the trainer's next batch)
        were abandoned when the controller rolled the run back, and one that woke later
        would add episodes to, or take them from, the restored buffer. A bad `state` raises
        with the buffer unchanged."""
        fresh = ReplayBuffer(self._config)
        if state is not None:
            fresh.load_state_dict(state)
        for task in self._waiting:
            task.cancel()
        self._waiting.clear()
        self._buffer = fresh

    @contextlib.contextmanager
    def _tracked(self) -> Iterator[None]:
        """Registers the running endpoint's task while it may wait, so `restore` can cancel it."""
        task = asyncio.current_task()
        if task is not None:
            self._waiting.add(task)
        try:
            yield
        finally:
            if task is not None:
                self._waiting.discard(task)
