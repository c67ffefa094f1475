"""The controller's record of one replica slot (its state, its load and its queue) and of one
accepted call (`Request`), which a replica holds while it is queued or in flight there."""

from __future__ import annotations

import asyncio
import enum
from collections import deque
from collections.abc import Awaitable, Hashable
from dataclasses import dataclass, field
from typing import Any

from actor_service.metrics import ReplicaCounters, ReplicaStatus


class ReplicaState(enum.Enum):
    STARTING = "starting"
    HEALTHY = "healthy"
    RESTARTING = "restarting"
    FAILED = "failed"
    STOPPED = "stopped"


class Replica:
    """Slot `index` of a service. A restart puts a new process mesh in the same slot under
    a new `generation`; counters and the slot's GPUs carry over.

    `in_flight` and `queued` are what routers read (see `routers.ReplicaView`). `active`
    keeps the calls in flight in the order they were sent (a dict used as an ordered set),
    so that the oldest is known (see `_watchdog`). `host` is the index of the host the
    slot runs on, among the hosts the service was given (0 when it was given none).
    """

    def __init__(self, index: int, max_in_flight: int, procs: int, mesh_dim: str) -> None:
        self.index = index
        self.max_in_flight = max_in_flight
        self.generation = -1
        self.state = ReplicaState.STARTING
        self.mesh: Any = None
        self.pids: tuple[int, ...] = ()
        self.active: dict[Request, None] = {}
        self.backlog: deque[Request] = deque()
        self.counters = ReplicaCounters()
        self.last_error: str | None = None
        self.died_at: float | None = None  # time.time() of the last death
        self.death_reason: str | None = None  # Monarch's report of the last death
        self.restart_task: asyncio.Task[None] | None = None
        self.watch: asyncio.TimerHandle | None = None  # the hang timer of the oldest call
        self.host = 0
        self._rank0 = {mesh_dim: 0}
        self._single = procs == 1

    @property
    def in_flight(self) -> int:
        return len(self.active)

    @property
    def queued(self) -> int:
        return len(self.backlog)

    @property
    def healthy(self) -> bool:
        return self.state is ReplicaState.HEALTHY

    @property
    def has_slot(self) -> bool:
        return len(self.active) < self.max_in_flight

    def attach(self, generation: int, mesh: Any, pids: tuple[int, ...]) -> None:
        """A freshly started mesh now serves this slot."""
        self.generation = generation
        self.mesh = mesh
        self.pids = pids
        self.state = ReplicaState.HEALTHY

    def invoke(self, endpoint: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Sends one call to the replica's mesh; an awaitable of the endpoint's result.

        A multi-process replica runs the call on every rank (SPMD) and answers with rank
        0's result.
        """
        port = getattr(self.mesh, endpoint)
        if self._single:
            return port.call_one(*args, **kwargs)
        return self._first_rank(port.call(*args, **kwargs))

    async def _first_rank(self, values: Awaitable[Any]) -> Any:
        return (await values).item(**self._rank0)

    def status(self) -> ReplicaStatus:
        p50, p99 = self.counters.latency_percentiles()
        return ReplicaStatus(
            index=self.index,
            state=self.state.value,
            generation=self.generation,
            pids=self.pids if self.healthy else (),
            in_flight=self.in_flight,
            queued=self.queued,
            completed=self.counters.completed,
            failed=self.counters.failed,
            lost=self.counters.lost,
            restarts=self.counters.restarts,
            deaths=self.counters.deaths,
            hangs=self.counters.hangs,
            host=self.host,
            p50_ms=p50,
            p99_ms=p99,
            last_error=self.last_error,
        )

    def __repr__(self) -> str:
        return f"Replica({self.index}, {self.state.value}, gen={self.generation}, host={self.host})"


class _Omitted:
    """The result of a fanout request whose replica died before answering."""

    def __repr__(self) -> str:
        return "OMITTED"


OMITTED: Any = _Omitted()


@dataclass(eq=False, slots=True)
class Request:
    """A call accepted by the service.

    The caller awaits `future`, which is resolved exactly once however many times the call
    is sent. `replica` is set while the call is in flight there (`task` sends it); a request
    is owned by exactly one place at a time: a replica's queue, a replica's in-flight set,
    or the dispatcher's waiting list.
    """

    endpoint: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    future: asyncio.Future[Any]
    idempotent: bool
    session: Hashable | None = None
    pinned: Replica | None = None
    attempts: int = 0
    replica: Replica | None = None
    task: asyncio.Task[None] | None = None
    expiry: asyncio.TimerHandle | None = field(default=None)

    def resolve(self, result: Any) -> None:
        if not self.future.done():
            self.future.set_result(result)

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)
