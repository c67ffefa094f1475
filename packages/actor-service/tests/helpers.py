"""Waiting helpers shared by the fault tests: a listener that records replica events, and
a poll of `status()` until a condition holds. Monarch notices a dead process at its next
supervision poll (1 s in these tests, see conftest.py), and a machine under load is slow,
so the waits are generous; they bound a test that would otherwise hang, they time nothing.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from actor_service import ReplicaEvent, Service, ServiceStatus

WAIT_S = 60.0


class Recorder:
    """A listener that keeps every event and the thread it was called on."""

    def __init__(self) -> None:
        self.events: list[ReplicaEvent] = []
        self.threads: set[int] = set()

    def __call__(self, event: ReplicaEvent) -> None:
        self.events.append(event)
        self.threads.add(threading.get_ident())

    def kinds(self) -> list[tuple[int, str]]:
        return [(e.replica, e.kind) for e in self.events]

    async def wait_for(self, count: int, within: float = WAIT_S) -> list[ReplicaEvent]:
        deadline = time.monotonic() + within
        while len(self.events) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{count} events expected within {within} s: {self.kinds()}")
            await asyncio.sleep(0.05)
        return list(self.events)


async def first_event(
    seen: Recorder, replica: int, kind: str, within: float = WAIT_S
) -> ReplicaEvent:
    """The first `kind` event of `replica` that `seen` recorded, waiting up to `within`."""
    deadline = time.monotonic() + within
    while True:
        for event in seen.events:
            if (event.replica, event.kind) == (replica, kind):
                return event
        if time.monotonic() > deadline:
            raise AssertionError(
                f"no {kind!r} event of replica {replica} within {within:g} s: {seen.kinds()}"
            )
        await asyncio.sleep(0.05)


async def wait_until(
    svc: Service[Any], ok: Callable[[ServiceStatus], bool], within: float = WAIT_S
) -> ServiceStatus:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        status = svc.status()
        if ok(status):
            return status
        await asyncio.sleep(0.05)
    raise AssertionError(f"condition not reached within {within} s:\n{svc.status()}")
