"""`ServiceHandle`: a picklable stand-in for a `Service`, for use inside other actors.

A `Service` holds asyncio state on the event loop that spawned it, so it cannot travel.
`Service.handle()` spawns a small front actor in the service's own process; the handle
(which pickles as a reference to that actor plus the endpoint table) sends each call to the
front, which hands it to the service's loop. Calls from a handle therefore get the same
routing, caps, retries and errors as calls on the service, at the cost of one extra actor
hop (about one Monarch round trip).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any

from monarch.actor import ActorError

from actor_service.endpoint import EndpointAccess, Session


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
