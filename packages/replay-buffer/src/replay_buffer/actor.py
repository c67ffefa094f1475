"""`ReplayBufferActor`: a `ReplayBuffer` served from its own Monarch process.

The only module of this package that imports Monarch. Spawn it once and hand its mesh to
every producer and to the trainer:

    procs = this_host().spawn_procs(per_host={"procs": 1})
    buffer = procs.spawn("replay_buffer", ReplayBufferActor, config)
    await buffer.put.call_one(group)                         # a generator (waits for room)
    batch = await buffer.sample.call_one(version, batch_size)  # the trainer (None: not yet)
    batch = await buffer.sample_wait.call_one(version, batch_size, 5.0)  # or wait for one
    await procs.stop()

Errors raised by the buffer reach the caller as `monarch.actor.ActorError` whose
`.exception` is the original `ValueError` / `TypeError`; the actor keeps serving.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, cast

from monarch.actor import Actor, concurrent_endpoint

from replay_buffer.batch import SampledBatch
from replay_buffer.buffer import ReplayBuffer
from replay_buffer.config import ReplayBufferConfig
from replay_buffer.episode import Episode
from replay_buffer.sampling import SamplingPolicy
from replay_buffer.stats import BufferStats

if TYPE_CHECKING:
    from monarch._src.actor.endpoint import EndpointProperty

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _endpoint(
    method: Callable[Concatenate[Any, _P], Awaitable[_R]],
) -> EndpointProperty[_P, _R]:
    """`concurrent_endpoint`, with the endpoint's signature kept for the type checker.

    Every endpoint is concurrent: a plain async endpoint runs to completion before the actor
    reads its next message, so a `put` waiting for room would block the very `sample` that
    makes room, and a `sample_wait` would block the `put` it waits for. Each body below is
    synchronous apart from those three, so it still runs atomically, and Monarch starts
    bodies in the order one caller sent them.
    """
    return cast("EndpointProperty[_P, _R]", concurrent_endpoint(method))


class ReplayBufferActor(Actor):
    """Serves one `ReplayBuffer`; each endpoint is the buffer method of the same name."""

    def __init__(
        self, config: ReplayBufferConfig | None = None, policy: SamplingPolicy | None = None
    ) -> None:
        self._buffer = ReplayBuffer(config, policy=policy)

    @_endpoint
    async def add(self, episode: Episode) -> None:
        self._buffer.add(episode)

    @_endpoint
    async def add_many(self, episodes: list[Episode]) -> None:
        self._buffer.add_many(episodes)

    @_endpoint
    async def put(self, episodes: list[Episode]) -> None:
        """Returns once the episodes are added, after waiting for room if needed."""
        await self._buffer.put(episodes)

    @_endpoint
    async def wait_for_room(self, count: int = 1) -> None:
        await self._buffer.wait_for_room(count)

    @_endpoint
    async def sample(self, curr_policy_version: int, batch_size: int) -> SampledBatch | None:
        return self._buffer.sample(curr_policy_version, batch_size)

    @_endpoint
    async def sample_wait(
        self,
        curr_policy_version: int,
        batch_size: int,
        # A caller cannot cancel the wait in this process: the bound has to travel with it.
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> SampledBatch | None:
        """Returns as soon as a batch can be formed, or None after `timeout` seconds."""
        return await self._buffer.sample_wait(curr_policy_version, batch_size, timeout)

    @_endpoint
    async def stats(self) -> BufferStats:
        return self._buffer.stats()

    @_endpoint
    async def state_dict(self) -> dict[str, Any]:
        return self._buffer.state_dict()

    @_endpoint
    async def load_state_dict(self, state: dict[str, Any]) -> None:
        self._buffer.load_state_dict(state)
