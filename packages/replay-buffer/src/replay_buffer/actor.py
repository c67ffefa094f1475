"""`ReplayBufferActor`: a `ReplayBuffer` served from its own Monarch process.

The only module of this package that imports Monarch. Spawn it once and hand its mesh to
every producer and to the trainer:

    procs = this_host().spawn_procs(per_host={"procs": 1})
    buffer = procs.spawn("replay_buffer", ReplayBufferActor, config)
    await buffer.put.call_one(EpisodeBatch(group))           # a generator (waits for room)
    batch = await buffer.sample.call_one(version, batch_size)  # the trainer (None: not yet)
    batch = await buffer.sample_wait.call_one(version, batch_size, 5.0)  # or wait for one
    snap = await buffer.snapshot.call_one()                  # a checkpoint's cut
    await buffer.restore.call_one(snap.state)                # a rollback to it
    await procs.stop()

`EpisodeBatch` sends many episodes as one columnar message (a plain list works too, about
half as fast to send and to receive); a `SampledBatch` always travels that way.

Errors raised by the buffer reach the caller as `monarch.actor.ActorError` whose
`.exception` is the original `ValueError` / `TypeError`; the actor keeps serving.

For fault tolerance, `put` answers with the actor's `incarnation` (a buffer process started
again after a death has another, so a caller can tell that the episodes it put went down
with the old one), `snapshot` takes the state and the groups held in one step, and
`restore` replaces the content after cancelling every put and sample still waiting (their
callers were rolled back too). A subclass may record the waits by overriding `_traced` and
`_held` (the monarch-rl app draws them on its timeline).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import os
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, cast

from monarch.actor import Actor, concurrent_endpoint

from replay_buffer import _state
from replay_buffer.batch import SampledBatch
from replay_buffer.buffer import ReplayBuffer
from replay_buffer.config import ReplayBufferConfig
from replay_buffer.episode import Episode, GroupId
from replay_buffer.sampling import SamplingPolicy
from replay_buffer.stats import BufferStats
from replay_buffer.wire import EpisodeBatch

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


@dataclasses.dataclass(frozen=True)
class BufferSnapshot:
    """The buffer at one instant: its `state_dict`, and the groups it holds as (group id, the
    oldest policy version among the group's episodes), what a caller checks its own
    bookkeeping against at a checkpoint."""

    state: dict[str, Any]
    groups: tuple[tuple[GroupId, int], ...]

    def __reduce__(self) -> tuple[Any, ...]:
        # The held episodes travel as one columnar record: a checkpoint holds training
        # while its snapshot crosses to the caller.
        shell, episodes = _state.episodes_apart(self.state)
        return (_rebuilt_snapshot, (shell, episodes, self.groups))


def _rebuilt_snapshot(
    shell: dict[str, Any], episodes: EpisodeBatch, groups: tuple[tuple[GroupId, int], ...]
) -> BufferSnapshot:
    return BufferSnapshot(_state.episodes_back(shell, episodes), groups)


class _NoSpan:
    def set(self, **args: Any) -> None:
        """Arguments learned while the span ran (recorded by a subclass's `_traced`)."""


class ReplayBufferActor(Actor):
    """Serves one `ReplayBuffer`; each endpoint is the buffer method of the same name, plus
    `snapshot` and `restore`."""

    def __init__(
        self, config: ReplayBufferConfig | None = None, policy: SamplingPolicy | None = None
    ) -> None:
        self._config = config
        # Untouched copy: `restore` starts every replacement buffer from the same policy.
        self._policy = copy.deepcopy(policy)
        self._buffer = ReplayBuffer(config, policy=policy)
        self.incarnation = f"{os.getpid()}-{id(self):x}"
        """Tells this actor from the one a restart brings: what `put` answers with."""
        self._waiting: set[asyncio.Task[Any]] = set()

    # Hooks for a subclass that records what the buffer waits on; they do nothing here.

    def _traced(
        self, name: str, *, track: str, wait: bool = False, **args: Any
    ) -> contextlib.AbstractContextManager[Any]:
        """Wraps each wait for room, each put and each wait for a batch; what it yields gets
        `.set(got=...)` when a wait ends."""
        del name, track, wait, args
        return contextlib.nullcontext(_NoSpan())

    def _held(self, episodes: int) -> None:
        """Called with the episodes held after each put and each wait for a batch."""

    @_endpoint
    async def add(self, episode: Episode) -> None:
        self._buffer.add(episode)

    @_endpoint
    async def add_many(self, episodes: Sequence[Episode]) -> None:
        self._buffer.add_many(episodes)

    @_endpoint
    async def put(self, episodes: Sequence[Episode]) -> str:
        """Returns once the episodes are added, after waiting for room if needed; answers
        with the `incarnation` that holds them."""
        n = len(episodes)
        with self._cancellable():
            with self._traced("wait_for_room", track="put", wait=True, episodes=n):
                await self._buffer.wait_for_room(n)
            with self._traced("put", track="put", episodes=n):
                await self._buffer.put(episodes)  # at once, unless another took the room
        self._held(len(self._buffer))
        return self.incarnation

    @_endpoint
    async def wait_for_room(self, count: int = 1) -> None:
        with self._cancellable():
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
        traced = self._traced("sample_wait", track="sample", wait=True, version=curr_policy_version)
        with self._cancellable(), traced as span:
            batch = await self._buffer.sample_wait(curr_policy_version, batch_size, timeout)
            span.set(got=batch is not None)
        self._held(len(self._buffer))
        return batch

    @_endpoint
    async def stats(self) -> BufferStats:
        return self._buffer.stats()

    @_endpoint
    async def state_dict(self) -> dict[str, Any]:
        return self._buffer.state_dict()

    @_endpoint
    async def load_state_dict(self, state: dict[str, Any]) -> None:
        self._buffer.load_state_dict(state)

    @_endpoint
    async def snapshot(self) -> BufferSnapshot:
        """The whole state and the groups held, taken atomically (no put or sample in
        between)."""
        state = self._buffer.state_dict()
        groups = [
            (eps[0]["group_id"], min(int(e["policy_version"]) for e in eps))
            for eps in (item["episodes"] for item in state["items"])
        ]
        return BufferSnapshot(state, tuple(groups))

    @_endpoint
    async def restore(self, state: dict[str, Any] | None) -> None:
        """Replaces the content with `state` (None: empty, as new), after cancelling every
        put and wait still waiting: their callers were abandoned when the caller rolled back,
        and one that woke later would add episodes to, or take them from, the restored
        buffer. A bad `state` raises with the buffer unchanged."""
        fresh = ReplayBuffer(self._config, policy=copy.deepcopy(self._policy))
        if state is not None:
            fresh.load_state_dict(state)
        for task in self._waiting:
            task.cancel()
        self._waiting.clear()
        self._buffer = fresh

    @contextlib.contextmanager
    def _cancellable(self) -> Iterator[None]:
        """Registers the running endpoint's task while it may wait, so `restore` can cancel
        it."""
        task = asyncio.current_task()
        if task is not None:
            self._waiting.add(task)
        try:
            yield
        finally:
            if task is not None:
                self._waiting.discard(task)
