"""The hang watchdog's clock rules, on a fake event loop clock (no Monarch, no sleeping):
only a replica's oldest unanswered call is timed, from when it became the oldest."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

from actor_service import ServiceConfig
from actor_service._watchdog import HangWatch
from actor_service.replica import Replica, ReplicaState, Request


class Timer:
    def __init__(self, at: float, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        self.at, self.fn, self.args, self.cancelled = at, fn, args, False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """Just enough of an event loop for `HangWatch`: a clock moved by hand."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[Timer] = []

    def call_later(self, delay: float, fn: Callable[..., None], *args: Any) -> Timer:
        timer = Timer(self.now + delay, fn, args)
        self.timers.append(timer)
        return timer

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for timer in [t for t in self.timers if not t.cancelled and t.at <= self.now]:
            self.timers.remove(timer)
            timer.fn(*timer.args)


class Harness:
    def __init__(self, config: ServiceConfig) -> None:
        self.loop = FakeLoop()
        self.hung: list[tuple[int, str, float]] = []
        self.watch = HangWatch(config, self.on_hung, cast(asyncio.AbstractEventLoop, self.loop))
        self.replica = Replica(0, 4, 1, "procs")
        self.replica.attach(0, None, (1,))

    def on_hung(self, replica: Replica, generation: int, req: Request, seconds: float) -> None:
        self.hung.append((generation, req.endpoint, seconds))

    def send(self, endpoint: str) -> Request:
        future: asyncio.Future[Any] = cast(asyncio.Future[Any], object())
        req = Request(endpoint, (), {}, future, True)
        self.replica.active[req] = None
        self.watch.sent(self.replica, req)
        return req

    def answer(self, req: Request) -> None:
        was_oldest = next(iter(self.replica.active)) is req
        del self.replica.active[req]
        self.watch.answered(self.replica, was_oldest)


def test_a_call_waiting_behind_another_is_timed_from_when_it_becomes_the_oldest() -> None:
    h = Harness(ServiceConfig(call_timeout_s=3.0))
    first = h.send("work")
    h.loop.advance(1.0)
    h.send("work")  # waits in the mailbox behind `first`
    h.loop.advance(1.5)
    h.answer(first)  # t = 2.5: the second call starts running now
    h.loop.advance(2.9)  # t = 5.4: 4.4 s after its send, 2.9 s after it became the oldest
    assert h.hung == []
    h.loop.advance(0.2)
    assert h.hung == [(0, "work", 3.0)]


def test_answered_calls_leave_no_timer_behind() -> None:
    h = Harness(ServiceConfig(call_timeout_s=1.0))
    for _ in range(5):
        h.answer(h.send("work"))
    h.loop.advance(10.0)
    assert h.hung == []
    assert h.replica.watch is None


def test_endpoint_timeouts_replace_the_default_and_an_untimed_call_holds_the_clock() -> None:
    h = Harness(ServiceConfig(endpoint_timeouts=(("ping", 0.5),)))  # no default timeout
    slow = h.send("generate")  # untimed
    h.send("ping")
    h.loop.advance(5.0)
    assert h.hung == []  # `ping` waits behind an untimed call: its clock has not started
    h.answer(slow)
    h.loop.advance(0.6)
    assert h.hung == [(0, "ping", 0.5)]


def test_a_replica_that_is_down_or_restarted_is_not_reported() -> None:
    h = Harness(ServiceConfig(call_timeout_s=1.0))
    h.send("work")
    h.replica.state = ReplicaState.RESTARTING  # it died meanwhile: that report won
    h.loop.advance(2.0)
    h.replica.state = ReplicaState.HEALTHY
    h.send("work")
    h.watch.disarm(h.replica)
    h.loop.advance(2.0)
    assert h.hung == []
