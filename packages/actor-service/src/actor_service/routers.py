"""Routers: which healthy replica serves the next `route()` call.

A router is any object with `pick` and `end_session` (the `Router` protocol). The service
calls `pick` on its event loop only, with the healthy replicas in index order, so routers
need no locks. They see a replica through `ReplicaView`: its index and its load.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol, runtime_checkable


class ReplicaView(Protocol):
    """What a router may read about one replica."""

    @property
    def index(self) -> int:
        """Position of the replica in the service, 0-based; stable across restarts."""
        ...

    @property
    def in_flight(self) -> int:
        """Requests sent to the replica and not yet answered."""
        ...

    @property
    def queued(self) -> int:
        """Requests assigned to the replica, waiting for one of its concurrency slots."""
        ...


@runtime_checkable
class Router(Protocol):
    """Chooses a replica for each request."""

    def pick(self, replicas: Sequence[ReplicaView], session: Hashable | None) -> ReplicaView:
        """One of `replicas` (healthy, index order, never empty). `session` is the session
        key of a call made inside `Service.session()`, else None."""
        ...

    def end_session(self, session: Hashable) -> None:
        """The session is over: forget anything kept for it."""
        ...


class RoundRobin:
    """Each replica in turn, by index; a replica that is not healthy is skipped."""

    supports_sessions = False

    def __init__(self) -> None:
        self._last = -1

    def pick(self, replicas: Sequence[ReplicaView], session: Hashable | None) -> ReplicaView:
        # The next index after the last one picked, so that a replica leaving or rejoining
        # the healthy set does not reset the rotation.
        for replica in replicas:
            if replica.index > self._last:
                self._last = replica.index
                return replica
        self._last = replicas[0].index
        return replicas[0]

    def end_session(self, session: Hashable) -> None:
        return None


class LeastLoaded:
    """The replica with the fewest requests in flight plus queued; ties go round-robin so
    that an idle service still spreads its calls."""

    supports_sessions = False

    def __init__(self) -> None:
        self._ties = RoundRobin()

    def pick(self, replicas: Sequence[ReplicaView], session: Hashable | None) -> ReplicaView:
        best = min(r.in_flight + r.queued for r in replicas)
        tied = [r for r in replicas if r.in_flight + r.queued == best]
        return tied[0] if len(tied) == 1 else self._ties.pick(tied, None)

    def end_session(self, session: Hashable) -> None:
        return None


class Sticky:
    """Session affinity: every call of a session goes to the replica its first call went to,
    while that replica is healthy. Calls outside a session, a session's first call, and a
    session whose replica died are placed by `fallback` (the session then sticks to the new
    replica)."""

    supports_sessions = True

    def __init__(self, fallback: Router | None = None) -> None:
        self.fallback: Router = fallback if fallback is not None else LeastLoaded()
        self._bound: dict[Hashable, int] = {}

    def pick(self, replicas: Sequence[ReplicaView], session: Hashable | None) -> ReplicaView:
        if session is None:
            return self.fallback.pick(replicas, None)
        index = self._bound.get(session)
        if index is not None:
            for replica in replicas:
                if replica.index == index:
                    return replica
        replica = self.fallback.pick(replicas, None)
        self._bound[session] = replica.index
        return replica

    def end_session(self, session: Hashable) -> None:
        self._bound.pop(session, None)

    @property
    def sessions(self) -> int:
        """Sessions currently bound to a replica."""
        return len(self._bound)


def supports_sessions(router: Router) -> bool:
    """Whether `router` keeps a session on one replica (routers declare it with a
    `supports_sessions` attribute; without one, they are assumed not to)."""
    return bool(getattr(router, "supports_sessions", False))
