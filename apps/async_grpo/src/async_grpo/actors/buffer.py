"""The replay buffer actor: a `replay_buffer.ReplayBuffer` in its own process, with its
waits traced.

`replay_buffer.ReplayBufferActor` serves the same buffer; this one serves only what the
run and its tests call (`put`, `sample_wait`, `sample`, `stats`) and records, when tracing
is on, how long each producer waited for room, how long each put took, how long the
trainer's request waited for a batch, and the number of episodes held (a counter track).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, cast

from monarch.actor import Actor, concurrent_endpoint
from replay_buffer import BufferStats, Episode, ReplayBuffer, ReplayBufferConfig, SampledBatch

from async_grpo import tracing

if TYPE_CHECKING:
    from monarch._src.actor.endpoint import EndpointProperty

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _endpoint(
    method: Callable[Concatenate[Any, _P], Awaitable[_R]],
) -> EndpointProperty[_P, _R]:
    """`concurrent_endpoint`, typed: a `put` waiting for room must not block the
    `sample_wait` that makes room, nor the other way round."""
    return cast("EndpointProperty[_P, _R]", concurrent_endpoint(method))


class BufferActor(Actor):
    """Serves one `ReplayBuffer` built from `config`."""

    def __init__(self, config: ReplayBufferConfig) -> None:
        tracing.start_from_env("buffer")
        self._buffer = ReplayBuffer(config)

    @_endpoint
    async def put(self, episodes: list[Episode]) -> None:
        """Returns once the episodes are added, after waiting for room if needed."""
        n = len(episodes)
        with tracing.span("wait_for_room", track="put", wait=True, episodes=n):
            await self._buffer.wait_for_room(n)
        with tracing.span("put", track="put", episodes=n):
            await self._buffer.put(episodes)  # at once, unless another producer took the room
        tracing.counter("buffer", episodes=len(self._buffer))

    @_endpoint
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

    @_endpoint
    async def sample(self, curr_policy_version: int, batch_size: int) -> SampledBatch | None:
        """A batch for the trainer at `curr_policy_version` now, or None (no wait)."""
        return self._buffer.sample(curr_policy_version, batch_size)

    @_endpoint
    async def stats(self) -> BufferStats:
        return self._buffer.stats()
