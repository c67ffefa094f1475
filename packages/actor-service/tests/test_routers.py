"""Routers are pure: checked on plain objects, without Monarch."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest
from actor_service import LeastLoaded, RoundRobin, Router, Sticky
from actor_service.routers import supports_sessions


@dataclass
class Fake:
    index: int
    in_flight: int = 0
    queued: int = 0


def picks(router: Router, replicas: list[Fake], n: int, session: str | None = None) -> Counter[int]:
    return Counter(router.pick(replicas, session).index for _ in range(n))


def test_round_robin_spreads_evenly_and_skips_missing_replicas() -> None:
    rr = RoundRobin()
    three = [Fake(0), Fake(1), Fake(2)]
    assert [rr.pick(three, None).index for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    # Replica 1 left the healthy set: the rotation continues over 0 and 2.
    assert [rr.pick([three[0], three[2]], None).index for _ in range(4)] == [2, 0, 2, 0]
    assert picks(RoundRobin(), three, 300) == {0: 100, 1: 100, 2: 100}


def test_least_loaded_counts_in_flight_plus_queued() -> None:
    replicas = [Fake(0, in_flight=2), Fake(1, in_flight=1, queued=3), Fake(2, in_flight=1)]
    assert picks(LeastLoaded(), replicas, 10) == {2: 10}
    replicas[2].queued = 5
    assert picks(LeastLoaded(), replicas, 10) == {0: 10}


def test_least_loaded_breaks_ties_round_robin() -> None:
    idle = [Fake(0), Fake(1), Fake(2), Fake(3)]
    assert picks(LeastLoaded(), idle, 400) == {0: 100, 1: 100, 2: 100, 3: 100}


def test_sticky_keeps_a_session_on_its_replica_and_falls_back_when_it_is_gone() -> None:
    router = Sticky(fallback=RoundRobin())
    replicas = [Fake(0), Fake(1), Fake(2)]
    first = router.pick(replicas, "a").index
    assert picks(router, replicas, 20, "a") == {first: 20}
    other = router.pick(replicas, "b").index
    assert other != first  # the fallback (round-robin) placed the new session elsewhere
    # The session's replica is no longer healthy: the fallback picks, and the session sticks.
    survivors = [r for r in replicas if r.index != first]
    moved = router.pick(survivors, "a").index
    assert moved != first
    assert picks(router, replicas, 10, "a") == {moved: 10}
    assert router.sessions == 2
    router.end_session("a")
    router.end_session("missing")
    assert router.sessions == 1


def test_sticky_without_session_uses_the_fallback() -> None:
    assert picks(Sticky(RoundRobin()), [Fake(0), Fake(1)], 10) == {0: 5, 1: 5}
    busy = [Fake(0, in_flight=4), Fake(1)]
    assert picks(Sticky(), busy, 5) == {1: 5}  # default fallback: least loaded


@pytest.mark.parametrize(
    ("router", "sessions"), [(RoundRobin(), False), (LeastLoaded(), False), (Sticky(), True)]
)
def test_routers_satisfy_the_protocol(router: Router, sessions: bool) -> None:
    assert isinstance(router, Router)
    assert supports_sessions(router) is sessions
