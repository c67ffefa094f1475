"""Endpoints of a service and their adverbs (`route`, `fanout`, `call_one`), sessions, and
the `@non_idempotent` marker."""

from __future__ import annotations

import uuid
from collections.abc import Hashable, Mapping
from types import TracebackType
from typing import Any, Generic, ParamSpec, Protocol, TypeVar, overload

from monarch._src.actor.endpoint import Endpoint, EndpointProperty
from monarch.actor import Actor

P = ParamSpec("P")
R = TypeVar("R")
E = TypeVar("E")

_NON_IDEMPOTENT = "_actor_service_non_idempotent"


def non_idempotent(ep: E) -> E:
    """Declares an endpoint non-idempotent: a call that was in flight on a replica that died
    is not sent again (it may have run), and the caller gets `ReplicaDiedError`. Put it
    above `@endpoint`:

        @non_idempotent
        @endpoint
        async def append(self, item: str) -> int: ...
    """
    if not isinstance(ep, EndpointProperty):
        raise TypeError(f"@non_idempotent goes above @endpoint, got {ep!r}")
    setattr(ep, _NON_IDEMPOTENT, True)
    return ep


def endpoint_table(actor_cls: type[Actor], non_idempotent: tuple[str, ...]) -> dict[str, bool]:
    """Endpoint name -> idempotent, for every endpoint of `actor_cls`. `non_idempotent`
    names more non-idempotent endpoints; a name that is not an endpoint is an error."""
    table = {
        name: not getattr(value, _NON_IDEMPOTENT, False)
        for name in dir(actor_cls)
        if isinstance(value := getattr(actor_cls, name, None), EndpointProperty)
    }
    if not table:
        raise ValueError(f"{actor_cls.__name__} has no @endpoint methods to serve")
    unknown = sorted(set(non_idempotent) - set(table))
    if unknown:
        raise ValueError(
            f"ServiceConfig.non_idempotent names {unknown}, which are not endpoints of "
            f"{actor_cls.__name__} (endpoints: {sorted(table)})"
        )
    for name in non_idempotent:
        table[name] = False
    return table


def check_timed_endpoints(
    actor_cls: type[Actor], table: Mapping[str, bool], timeouts: tuple[tuple[str, float], ...]
) -> None:
    """A `ValueError` if `ServiceConfig.endpoint_timeouts` names a non-endpoint."""
    unknown = sorted({name for name, _ in timeouts} - set(table))
    if unknown:
        raise ValueError(
            f"ServiceConfig.endpoint_timeouts names {unknown}, which are not endpoints of "
            f"{actor_cls.__name__} (endpoints: {sorted(table)})"
        )


class Backend(Protocol):
    """What the adverbs call: a `Service` in its own process, or a `ServiceHandle`
    anywhere else."""

    async def _route(
        self, endpoint: str, args: tuple[Any, ...], kwargs: dict[str, Any], session: Hashable
    ) -> Any: ...

    async def _fanout(
        self, endpoint: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> list[Any]: ...

    async def _call_one(
        self, endpoint: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any: ...

    async def _end_session(self, session: Hashable) -> None: ...


class ServiceEndpoint(Generic[P, R]):
    """One endpoint of a service. Typed when obtained with `service.endpoint(Cls.method)`;
    `service.method` gives the same object typed loosely (`Any` results)."""

    def __init__(self, backend: Backend, name: str, session: Hashable = None) -> None:
        self._backend = backend
        self._name = name
        self._session = session

    @property
    def name(self) -> str:
        return self._name

    async def route(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Calls the endpoint on one healthy replica chosen by the router (the session's
        replica inside a session). Retried on another replica if that one dies mid-call
        (idempotent endpoints); the endpoint's own exceptions come back as `ActorError`."""
        result: R = await self._backend._route(self._name, args, kwargs, self._session)
        return result

    async def fanout(self, *args: P.args, **kwargs: P.kwargs) -> list[R]:
        """Calls the endpoint on every healthy replica; results in replica order. A replica
        that dies during the call is left out of the result (it restarts fresh); the first
        exception raised by the endpoint's code on any replica is re-raised once all
        replicas answered."""
        results: list[R] = await self._backend._fanout(self._name, args, kwargs)
        return results

    async def call_one(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """`route` for a service of exactly one replica (a `ValueError` otherwise), for
        single-actor components such as a trainer; same failure handling."""
        result: R = await self._backend._call_one(self._name, args, kwargs)
        return result

    def __repr__(self) -> str:
        return f"ServiceEndpoint({self._name!r})"


def endpoint_name(ep: object) -> str:
    """The name of an endpoint given as `MyActor.method` (or already as a string)."""
    if isinstance(ep, str):
        return ep
    if isinstance(ep, EndpointProperty):
        name = getattr(ep, "_name", None)  # set by @concurrent_endpoint
        return name if isinstance(name, str) else str(ep._method.__name__)
    raise TypeError(f"expected an endpoint such as MyActor.method, or its name; got {ep!r}")


class EndpointAccess:
    """Endpoint lookup shared by services, sessions and handles: `x.generate` or, typed,
    `x.endpoint(GeneratorActor.generate)`."""

    _backend: Backend
    _table: Mapping[str, bool]
    _session_key: Hashable = None

    def _init_endpoints(self, backend: Backend, table: Mapping[str, bool]) -> None:
        self._backend = backend
        self._table = table
        self._endpoints: dict[str, ServiceEndpoint[..., Any]] = {
            name: ServiceEndpoint(backend, name, self._session_key) for name in table
        }

    @overload
    def endpoint(self, ep: Endpoint[P, R]) -> ServiceEndpoint[P, R]: ...

    @overload
    def endpoint(self, ep: str) -> ServiceEndpoint[..., Any]: ...

    def endpoint(self, ep: Endpoint[P, R] | str) -> ServiceEndpoint[Any, Any]:
        """The endpoint `ep` (`MyActor.method` for a typed result, or its name); also the
        way to reach an endpoint whose name clashes with a service method (`status`...)."""
        name = endpoint_name(ep)
        endpoints = self.__dict__.get("_endpoints", {})
        if name not in endpoints:
            raise AttributeError(f"no endpoint {name!r}; endpoints: {sorted(endpoints)}")
        found: ServiceEndpoint[Any, Any] = endpoints[name]
        return found

    def __getattr__(self, name: str) -> ServiceEndpoint[..., Any]:
        # Only called when normal lookup fails, so the service's own attributes win.
        endpoints = self.__dict__.get("_endpoints")
        if endpoints is not None and name in endpoints:
            found: ServiceEndpoint[..., Any] = endpoints[name]
            return found
        known = sorted(endpoints) if endpoints is not None else []
        raise AttributeError(f"{type(self).__name__} has no endpoint {name!r}; endpoints: {known}")


class Session(EndpointAccess):
    """Calls made through a session go to one replica while it is healthy (with a router
    that supports sessions, such as `Sticky`). Use as `async with service.session() as s:`."""

    def __init__(self, backend: Backend, table: Mapping[str, bool]) -> None:
        self._session_key = uuid.uuid4().hex
        self._init_endpoints(backend, table)

    @property
    def key(self) -> Hashable:
        return self._session_key

    async def close(self) -> None:
        """Ends the session (the router forgets its replica)."""
        await self._backend._end_session(self._session_key)

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
