"""One call on its way through a service: what to send, where it is, how many tries."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from actor_service.replica import Replica


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
