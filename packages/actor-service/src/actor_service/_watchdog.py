"""Finding hung replicas: one timer per replica, on its oldest unanswered call.

A replica that hangs (its process alive, its endpoint never returning) is invisible to
Monarch's supervision, which only notices processes and actors that fail. The service
notices it by time instead: a call that goes unanswered for longer than its timeout
(`ServiceConfig.call_timeout_s`, or `endpoint_timeouts` for its endpoint) marks its
replica hung.

Only a replica's oldest unanswered call is timed. Monarch runs a plain endpoint one message
at a time, so the calls behind it wait in the replica's mailbox; timing them from their
send would blame a slow call's neighbours (a 1 s `ping` queued behind a 60 s `generate`).
A call's clock therefore starts when it is sent or when every call sent to that replica
before it is answered, whichever is later. For `@concurrent_endpoint` actors this can only
start a clock late, never early: a hang is still found, after the calls ahead of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from actor_service.config import ServiceConfig
from actor_service.replica import Replica, Request

OnHung = Callable[[Replica, int, Request, float], None]
"""`on_hung(replica, generation, request, seconds)`: `request` went unanswered for
`seconds` on `replica`'s mesh of `generation`."""


class HangWatch:
    """Times the oldest call in flight on each replica; runs on the service's event loop."""

    def __init__(
        self,
        config: ServiceConfig,
        on_hung: OnHung,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self._default = config.call_timeout_s
        self._per_endpoint = {name: float(s) for name, s in config.endpoint_timeouts}
        self._on_hung = on_hung
        self._loop = loop or asyncio.get_running_loop()

    @property
    def enabled(self) -> bool:
        return self._default is not None or bool(self._per_endpoint)

    def timeout(self, endpoint: str) -> float | None:
        """Seconds a call to `endpoint` may go unanswered; None: no limit."""
        seconds = self._per_endpoint.get(endpoint, self._default)
        return None if seconds is None else float(seconds)

    def sent(self, replica: Replica, req: Request) -> None:
        """`req` was just added to `replica.active`; starts its clock if nothing is ahead."""
        if self.enabled and len(replica.active) == 1:
            self._arm(replica)

    def answered(self, replica: Replica, was_oldest: bool) -> None:
        """A call left `replica.active`; if it was the oldest, the next one's clock starts."""
        if was_oldest:
            self.disarm(replica)
            if self.enabled:
                self._arm(replica)

    def disarm(self, replica: Replica) -> None:
        if replica.watch is not None:
            replica.watch.cancel()
            replica.watch = None

    def _arm(self, replica: Replica) -> None:
        oldest = next(iter(replica.active), None)
        if oldest is None:
            return
        seconds = self.timeout(oldest.endpoint)
        if seconds is None:
            return  # untimed; the calls behind it start their clocks once it is answered
        replica.watch = self._loop.call_later(
            seconds, self._fire, replica, replica.generation, oldest, seconds
        )

    def _fire(self, replica: Replica, generation: int, req: Request, seconds: float) -> None:
        replica.watch = None
        still_oldest = next(iter(replica.active), None) is req
        if replica.generation == generation and replica.healthy and still_oldest:
            self._on_hung(replica, generation, req, seconds)
