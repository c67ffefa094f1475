"""`Service` and `spawn_service`: N replicas of an actor behind route / fanout / sessions."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import copy
import logging
import uuid
from collections.abc import Callable, Coroutine, Hashable, Sequence
from types import TracebackType
from typing import Any, Generic, TypeVar

from monarch.actor import Actor, HostMesh, this_proc
from monarch.actor.concurrent import concurrent_endpoint

from actor_service._deadline import within
from actor_service._dispatch import Dispatcher
from actor_service._hosts import single_hosts
from actor_service._lifecycle import Launcher
from actor_service.config import ServiceConfig
from actor_service.endpoint import (
    EndpointAccess,
    Session,
    check_timed_endpoints,
    endpoint_table,
)
from actor_service.errors import NoHealthyReplicaError, ServiceClosedError
from actor_service.events import Listeners, ReplicaEvent
from actor_service.handle import ServiceHandle
from actor_service.metrics import ServiceStatus, percentile
from actor_service.replica import OMITTED, Replica, ReplicaState, Request
from actor_service.routers import supports_sessions

log = logging.getLogger(__name__)

A = TypeVar("A", bound=Actor)


class Service(EndpointAccess, Generic[A]):
    """A managed group of replicas of one actor class; create it with `spawn_service`.

    Its endpoints are its attributes: `await svc.generate.route(prompt)`. The Service lives
    in the process (and on the event loop) that spawned it; give other actors
    `svc.handle()` instead. Failure semantics are in the package README.
    """

    def __init__(
        self,
        actor_cls: type[A],
        config: ServiceConfig,
        args: tuple[Any, ...],
        kwargs: Any,
        hosts: list[HostMesh] | None = None,
    ) -> None:
        self._actor_cls = actor_cls
        self._config = config
        self._router = copy.deepcopy(config.router)
        table = endpoint_table(actor_cls, config.non_idempotent)
        check_timed_endpoints(actor_cls, table, config.endpoint_timeouts)
        dim = "gpus" if config.with_gpus else "procs"
        self._replicas = [
            Replica(i, config.max_in_flight_per_replica, config.procs_per_replica, dim)
            for i in range(config.replicas)
        ]
        self._events = Listeners(config.name)
        self._launcher = Launcher(
            config, self._replicas, actor_cls, args, dict(kwargs), events=self._events, hosts=hosts
        )
        self._dispatcher: Dispatcher | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._context: contextvars.Context | None = None
        self._front: Any = None
        self._shut = False
        self._init_endpoints(self, table)

    # ------------------------------------------------------------------ lifecycle
    def _died(self, replica: Replica) -> None:
        self._events.emit(replica, "died")
        self._launcher.restart_later(replica)
        if replica.state is ReplicaState.FAILED:  # died with its restart budget spent
            self._events.emit(replica, "gave_up")

    async def _start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._dispatcher = Dispatcher(self._config, self._replicas, self._router, self._died)
        self._launcher.open(self._dispatcher)
        self._context = contextvars.copy_context()  # after Monarch set the current actor
        results = await asyncio.gather(
            *(self._launcher.start(r) for r in self._replicas), return_exceptions=True
        )
        errors = [e for e in results if isinstance(e, BaseException)]
        if errors:
            await self.shutdown()
            raise errors[0]
        for replica in self._replicas:
            self._dispatcher.replica_up(replica)  # skips one that already died again

    async def shutdown(self) -> None:
        """Stops the service: new calls raise `ServiceClosedError`, accepted calls get up to
        `drain_timeout_s` to finish (the rest fail with `ServiceClosedError`), then every
        process the service started is stopped. Safe to call twice."""
        if self._shut:
            return
        self._shut = True
        dispatcher = self._dispatcher
        if dispatcher is not None:
            dispatcher.accepting = False  # refuse new calls; retries of accepted ones still run
            pending = dispatcher.pending()
            if pending:
                await asyncio.wait(pending, timeout=self._config.drain_timeout_s)
            dispatcher.close()
        if self._front is not None:
            unregister(self)
            try:
                await within(
                    self._config.stop_timeout_s,
                    "stopping the handles' front actor",
                    self._front.stop(),
                    "stop_timeout_s",
                )
            except Exception as e:  # it runs in this process; closing goes on regardless
                log.warning("service %s: %s", self.name, e)
        await self._launcher.close()

    async def __aenter__(self) -> Service[A]:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.shutdown()

    # ------------------------------------------------------------------ public API
    @property
    def config(self) -> ServiceConfig:
        return self._config

    @property
    def name(self) -> str:
        return self._config.name

    def session(self) -> Session:
        """A sticky session: `async with svc.session() as s: await s.generate.route(...)`.
        Needs a router that supports sessions (the default `Sticky` does)."""
        if not supports_sessions(self._router):
            raise ValueError(
                f"service {self.name}: router {type(self._router).__name__} does not keep "
                "sessions on a replica; use Sticky(fallback=...) as ServiceConfig.router"
            )
        return Session(self, self._table)

    def add_listener(self, listener: Callable[[ReplicaEvent], None]) -> None:
        """Calls `listener(event)` for every later `ReplicaEvent`: a replica "died", is
        "up" again after a restart, or "gave_up" (restart budget spent). It runs on the
        service's event loop (in the process that spawned the service), in the order the
        events happened; it must not block. One that raises is logged and changes nothing
        else. `TypeError` for something that is not a plain (non-async) callable."""
        self._events.add(listener)

    def status(self) -> ServiceStatus:
        """A snapshot of every replica's state, load and counters."""
        replicas = tuple(r.status() for r in self._replicas)
        latencies = sorted(x for r in self._replicas for x in r.counters.latencies_ms)
        d = self._dispatcher
        return ServiceStatus(
            name=self.name,
            closed=self._shut,
            replicas=replicas,
            waiting=d.waiting if d else 0,
            retried=d.retried if d else 0,
            rejected=d.rejected if d else 0,
            p50_ms=percentile(latencies, 0.5),
            p99_ms=percentile(latencies, 0.99),
            hosts_down=tuple(sorted(self._launcher.placement.down)),
        )

    def handle(self) -> ServiceHandle:
        """A picklable `ServiceHandle` that other actors can use like this service (its
        calls go through a small actor in this process, then the same routing)."""
        if self._front is None:
            self._front = open_front(self)
        return ServiceHandle(
            self._front, self.name, dict(self._table), supports_sessions(self._router)
        )

    def replica_meshes(self) -> list[Any]:
        """The actor mesh of every healthy replica, index order: for direct Monarch calls
        that bypass routing (e.g. benchmarks). Calls made this way get no retries."""
        return [r.mesh for r in self._replicas if r.healthy]

    # ------------------------------------------------------------------ backend
    def _submit(
        self, endpoint: str, args: tuple[Any, ...], kwargs: dict[str, Any], session: Hashable
    ) -> asyncio.Future[Any]:
        assert self._dispatcher is not None
        assert self._loop is not None
        future: asyncio.Future[Any] = self._loop.create_future()
        req = Request(endpoint, args, kwargs, future, self._table[endpoint], session)
        self._dispatcher.submit(req)
        return future

    async def _route(
        self, endpoint: str, args: tuple[Any, ...], kwargs: dict[str, Any], session: Hashable
    ) -> Any:
        return await self._submit(endpoint, args, kwargs, session)

    async def _call_one(self, endpoint: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if self._config.replicas != 1:
            raise ValueError(
                f"service {self.name} has {self._config.replicas} replicas; call_one is for a "
                "single-replica service: use route (one replica) or fanout (all)"
            )
        return await self._submit(endpoint, args, kwargs, None)

    async def _fanout(
        self, endpoint: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> list[Any]:
        assert self._dispatcher is not None
        assert self._loop is not None
        targets = await self._dispatcher.healthy_replicas()
        requests = [
            Request(endpoint, args, kwargs, self._loop.create_future(), True, pinned=r)
            for r in targets
        ]
        for req in requests:
            self._dispatcher.submit(req, admitted=True)
        results = await asyncio.gather(*(r.future for r in requests), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]
        answered = [r for r in results if r is not OMITTED]
        if not answered:
            raise NoHealthyReplicaError(
                f"service {self.name}: every replica targeted by `{endpoint}` fanout died"
            )
        return answered

    async def _end_session(self, session: Hashable) -> None:
        if self._dispatcher is not None:
            self._dispatcher.end_session(session)

    def __repr__(self) -> str:
        cls = self._actor_cls.__name__
        return f"Service({cls}, name={self.name!r}, replicas={len(self._replicas)})"


async def spawn_service(
    actor_cls: type[A],
    config: ServiceConfig,
    *args: Any,
    hosts: HostMesh | Sequence[HostMesh] | None = None,
    **kwargs: Any,
) -> Service[A]:
    """Spawns `config.replicas` replicas of `actor_cls`, each a process mesh of
    `config.procs_per_replica` processes, constructed with `*args, **kwargs`, and returns
    once every replica's `__init__` has run. If any replica fails to start, everything
    started is stopped and `ReplicaStartError` is raised.

    `hosts` (keyword only, so the actor cannot receive a keyword argument of that name):
    the host meshes the replicas may run on, a `HostMesh` or a list of them; every host of
    a multi-host mesh is used, in order. Replica `i` starts on host `i % n`; a replica whose
    host can no longer spawn processes is restarted on another. Left out: every replica
    runs on this host (`this_host()`). Checked before anything is spawned.

    Call it from the controller's event loop (or inside an actor); the service's state lives
    on that loop.
    """
    cls: object = actor_cls
    if not (isinstance(cls, type) and issubclass(cls, Actor)):
        raise TypeError(f"spawn_service needs an Actor subclass, got {actor_cls!r}")
    if not isinstance(config, ServiceConfig):
        raise TypeError(f"spawn_service needs a ServiceConfig, got {type(config).__name__}")
    placed = None if hosts is None else single_hosts(hosts)
    service = Service(actor_cls, config, args, kwargs, placed)
    await service._start()
    return service


# Services of this process that have a front, by id. The front actor runs in this same
# process (spawned on `this_proc()`), so it finds its service here.
_services: dict[str, Service[Any]] = {}


def open_front(service: Service[Any]) -> Any:
    """Registers `service` and spawns its front actor in this process."""
    service_id = uuid.uuid4().hex
    _services[service_id] = service
    service._front_id = service_id  # type: ignore[attr-defined]
    return this_proc().spawn(f"{service.name}_front", ServiceFront, service_id)


def unregister(service: Service[Any]) -> None:
    _services.pop(getattr(service, "_front_id", ""), None)


async def run_on_service_loop(
    service: Service[Any], start: Callable[[Service[Any]], Coroutine[Any, Any, Any]]
) -> Any:
    """Runs `start(service)` as a task on the service's loop, from another thread's loop.

    The task runs in the context captured when the service was spawned: Monarch keeps the
    current actor in a context variable, and calls made on behalf of a handle must be sent
    by the controller (whose fault hook tolerates replica deaths), not by the front actor.
    """
    loop, context = service._loop, service._context
    assert loop is not None
    assert context is not None
    outcome: concurrent.futures.Future[Any] = concurrent.futures.Future()
    tasks: list[asyncio.Task[Any]] = []

    def settle(task: asyncio.Task[Any]) -> None:
        if outcome.done():
            return
        if task.cancelled():
            outcome.cancel()
        elif (error := task.exception()) is not None:
            outcome.set_exception(error)
        else:
            outcome.set_result(task.result())

    def launch() -> None:
        task = loop.create_task(start(service), context=context.copy())
        tasks.append(task)
        task.add_done_callback(settle)

    loop.call_soon_threadsafe(launch)
    try:
        return await asyncio.wrap_future(outcome)
    except asyncio.CancelledError:
        loop.call_soon_threadsafe(lambda: [t.cancel() for t in tasks])
        raise


class ServiceFront(Actor):
    """Receives calls from `ServiceHandle`s and runs them on the service's event loop."""

    def __init__(self, service_id: str) -> None:
        self._service_id = service_id

    async def _on_service_loop(
        self, start: Callable[[Service[Any]], Coroutine[Any, Any, Any]]
    ) -> Any:
        service = _services.get(self._service_id)
        if service is None:
            raise ServiceClosedError("the service behind this handle is shut down")
        return await run_on_service_loop(service, start)

    @concurrent_endpoint
    async def route(
        self, endpoint: str, args: tuple[Any, ...], kwargs: dict[str, Any], session: Hashable
    ) -> Any:
        return await self._on_service_loop(lambda s: s._route(endpoint, args, kwargs, session))

    @concurrent_endpoint
    async def fanout(self, endpoint: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return await self._on_service_loop(lambda s: s._fanout(endpoint, args, kwargs))

    @concurrent_endpoint
    async def call_one(self, endpoint: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return await self._on_service_loop(lambda s: s._call_one(endpoint, args, kwargs))

    @concurrent_endpoint
    async def end_session(self, session: Hashable) -> None:
        await self._on_service_loop(lambda s: s._end_session(session))
