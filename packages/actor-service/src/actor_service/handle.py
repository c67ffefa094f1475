"""`ServiceHandle`: a picklable stand-in for a `Service`, for use inside other actors.

A `Service` holds asyncio state on the event loop that spawned it, so it cannot travel.
`Service.handle()` spawns a small front actor in the service's own process; the handle
(which pickles as a reference to that actor plus the endpoint table) sends each call to the
front, which hands it to the service's loop. Calls from a handle therefore get the same
routing, caps, retries and errors as calls on the service, at the cost of one extra actor
hop (about one Monarch round trip).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import uuid
from collections.abc import Callable, Coroutine, Hashable, Mapping
from typing import TYPE_CHECKING, Any

from monarch.actor import Actor, ActorError, this_proc
from monarch.actor.concurrent import concurrent_endpoint

from actor_service.endpoint import EndpointAccess, Session
from actor_service.errors import ServiceClosedError

if TYPE_CHECKING:
    from actor_service.service import Service

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


def _unwrap(error: ActorError) -> BaseException:
    """The error the caller would have got from the service itself. The front raises
    exactly what the service raised (the replica's `ActorError`, a `ServiceError`, ...) and
    its hop wraps that in one more `ActorError`."""
    return error.exception


class ServiceHandle(EndpointAccess):
    """Use it like the `Service`: `await handle.generate.route(x)`, `handle.session()`."""

    _front: Any
    _name: str
    _sessions: bool

    def __init__(self, front: Any, name: str, table: Mapping[str, bool], sessions: bool) -> None:
        self._front = front
        self._name = name
        self._sessions = sessions
        self._init_endpoints(self, table)

    @property
    def name(self) -> str:
        return self._name

    def session(self) -> Session:
        """A sticky session, as `Service.session()`."""
        if not self._sessions:
            raise ValueError(f"service {self._name}: its router does not keep sessions")
        return Session(self, self._table)

    async def _call(self, adverb: str, *args: Any) -> Any:
        try:
            return await getattr(self._front, adverb).call_one(*args)
        except ActorError as e:
            raise _unwrap(e) from None

    async def _route(
        self, endpoint: str, args: tuple[Any, ...], kwargs: dict[str, Any], session: Hashable
    ) -> Any:
        return await self._call("route", endpoint, args, kwargs, session)

    async def _fanout(
        self, endpoint: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> list[Any]:
        result: list[Any] = await self._call("fanout", endpoint, args, kwargs)
        return result

    async def _call_one(self, endpoint: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return await self._call("call_one", endpoint, args, kwargs)

    async def _end_session(self, session: Hashable) -> None:
        await self._call("end_session", session)

    def __getstate__(self) -> dict[str, Any]:
        return {
            "front": self._front,
            "name": self._name,
            "table": dict(self._table),
            "sessions": self._sessions,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["front"], state["name"], state["table"], state["sessions"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"ServiceHandle({self._name!r})"
