"""Replica lifecycle events: what `Service.add_listener` callbacks receive."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from actor_service.replica import Replica

log = logging.getLogger(__name__)

EventKind = Literal["died", "up", "gave_up"]

MAX_REASON_CHARS = 300
"""A reason longer than this is cut (Monarch's reports can hold whole tracebacks)."""


@dataclass(frozen=True)
class ReplicaEvent:
    """One change in a replica's life, told to the service's listeners.

    service: the service's name (`ServiceConfig.name`).
    replica: the replica's index, 0 <= replica < `ServiceConfig.replicas`.
    kind: "died" (a serving replica's process or actor failed, or it hung: a call went
        unanswered past its timeout, and its processes were stopped; a restart follows
        unless a "gave_up" event comes right after), "up" (a restarted replica serves again; the
        first start is not an event) or "gave_up" (the replica used up `max_restarts` and
        stays down).
    restarts: this replica's restarts so far (attempts, failed ones included), counting the
        one an "up" event announces.
    reason: one line. "died": Monarch's report of the failure, or for a hang
        "hung: no answer to `<endpoint>` within <N> s, so its processes are stopped".
        "up": the death it recovers from. "gave_up": the last error (the death, or the
        last failed restart).
    at: when the service learned of it, seconds since the epoch (`time.time()`).
    down_s: "up" only: seconds from the death it recovers from to now; None otherwise.
    host: the host the replica ran on ("died", "gave_up") or runs on now ("up": a replica
        whose host could not spawn processes any more is restarted on another), as its
        index among the hosts given to `spawn_service`; 0 without `hosts`.
    pids: the replica's processes, rank order: "died", those that died or hung (a hung
        one is still running when listeners hear of it, and is stopped after them, so a
        listener can look at it, e.g. dump its stack); "up", the new ones.
    """

    service: str
    replica: int
    kind: EventKind
    restarts: int
    reason: str
    at: float
    down_s: float | None = None
    host: int = 0
    pids: tuple[int, ...] = ()


def one_line(text: str | None) -> str:
    """The last non-blank line of `text`, stripped and cut to `MAX_REASON_CHARS`.

    The last line, because Monarch's reports open with the failed actor's path and end with
    the cause ("the process this actor was running on failed: Killed(sig=9)"), and a
    Python traceback ends with the exception.
    """
    lines = [s.strip() for s in (text or "").splitlines() if s.strip()]
    line = lines[-1] if lines else ""
    if len(line) > MAX_REASON_CHARS:
        line = line[: MAX_REASON_CHARS - 3] + "..."
    return line


class Listeners:
    """The listeners of one service. Events are delivered on the service's event loop, in
    the order they happened, each in its own loop callback: a listener never runs in the
    middle of the service's bookkeeping, and one that raises is logged while the others
    still run."""

    def __init__(self, service: str) -> None:
        self._service = service
        self._listeners: list[Callable[[ReplicaEvent], None]] = []

    def add(self, listener: Callable[[ReplicaEvent], None]) -> None:
        if not callable(listener):
            raise TypeError(
                f"service {self._service}: a listener must be callable, got {listener!r}"
            )
        if inspect.iscoroutinefunction(listener):
            raise TypeError(
                f"service {self._service}: listener {listener!r} is async; listeners are "
                "plain functions (start a task from one if you need to await)"
            )
        self._listeners.append(listener)

    def emit(self, replica: Replica, kind: EventKind) -> None:
        """Records `replica`'s event now (its state already updated) and schedules its
        delivery on the running loop."""
        at = time.time()
        down_s = None
        if kind == "up" and replica.died_at is not None:
            down_s = at - replica.died_at
        reason = replica.last_error if kind == "gave_up" else replica.death_reason
        event = ReplicaEvent(
            service=self._service,
            replica=replica.index,
            kind=kind,
            restarts=replica.counters.restarts,
            reason=one_line(reason),
            at=at,
            down_s=down_s,
            host=replica.host,
            pids=replica.pids if kind != "gave_up" else (),
        )
        if self._listeners:
            asyncio.get_running_loop().call_soon(self._deliver, event)

    def _deliver(self, event: ReplicaEvent) -> None:
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:  # a broken listener must not break supervision
                log.exception(
                    "service %s: listener %r failed on %s", self._service, listener, event
                )
