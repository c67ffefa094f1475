"""The replay buffer actor: `replay_buffer.ReplayBufferActor` with its waits traced.

When tracing is on it records how long each producer waited for room, how long each put
took, how long the trainer's request waited for a batch, and the number of episodes held (a
counter track). Every other endpoint is the package's.
"""

from __future__ import annotations

from monarch.actor import concurrent_endpoint
from replay_buffer import Episode, ReplayBufferActor, ReplayBufferConfig, SampledBatch

from async_grpo import tracing


class BufferActor(ReplayBufferActor):
    """Serves one `ReplayBuffer` built from `config`."""

    def __init__(self, config: ReplayBufferConfig) -> None:
        tracing.start_from_env("buffer")
        super().__init__(config)

    # Concurrent, as the package's: a `put` waiting for room must not block the
    # `sample_wait` that makes room, nor the other way round.
    @concurrent_endpoint
    async def put(self, episodes: list[Episode]) -> None:
        """Returns once the episodes are added, after waiting for room if needed."""
        n = len(episodes)
        with tracing.span("wait_for_room", track="put", wait=True, episodes=n):
            await self._buffer.wait_for_room(n)
        with tracing.span("put", track="put", episodes=n):
            await self._buffer.put(episodes)  # at once, unless another producer took the room
        tracing.counter("buffer", episodes=len(self._buffer))

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
        with tracing.span(
            "sample_wait", track="sample", wait=True, version=curr_policy_version
        ) as s:
            batch = await self._buffer.sample_wait(curr_policy_version, batch_size, timeout)
            s.set(got=batch is not None)
        tracing.counter("buffer", episodes=len(self._buffer))
        return batch
