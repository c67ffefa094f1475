"""Load handling on real replica processes: the per-replica cap, queueing, back-pressure,
least-loaded routing, and draining at shutdown."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Hashable, Sequence

import pytest
from actor_service import (
    LeastLoaded,
    ReplicaView,
    RoundRobin,
    ServiceClosedError,
    ServiceConfig,
    ServiceOverloadedError,
    spawn_service,
)
from service_actors import Echo, Parallel

# Several processes, seconds each: not in `nox -s fast`.
pytestmark = pytest.mark.slow


async def test_cap_limits_calls_per_replica_and_queues_the_rest() -> None:
    config = ServiceConfig(
        replicas=2, max_in_flight_per_replica=3, router=RoundRobin(), name="capped"
    )
    async with await spawn_service(Parallel, config) as svc:
        calls = [asyncio.ensure_future(svc.work.route(0.6)) for _ in range(24)]
        await asyncio.sleep(0.1)
        status = svc.status()
        assert [r.in_flight for r in status.replicas] == [3, 3]
        assert [r.queued for r in status.replicas] == [9, 9]
        pids = await asyncio.gather(*calls)
        assert sorted(Counter(pids).values()) == [12, 12]
        # The replicas run concurrent endpoints, so they would have taken all 12 at once:
        # the peak each one saw is the cap.
        assert await svc.peak_running.fanout() == [3, 3]
        assert svc.status().queued == 0


async def test_back_pressure_when_every_replica_is_saturated() -> None:
    config = ServiceConfig(replicas=1, max_in_flight_per_replica=2, max_queued=3, name="bp")
    async with await spawn_service(Parallel, config) as svc:
        accepted = [asyncio.ensure_future(svc.work.route(0.6)) for _ in range(5)]
        await asyncio.sleep(0.05)
        with pytest.raises(ServiceOverloadedError, match=r"3 requests already wait"):
            await svc.work.route(0.0)
        assert svc.status().rejected == 1
        assert len(await asyncio.gather(*accepted)) == 5  # nothing accepted was lost
        await svc.work.route(0.0)  # room again


async def test_least_loaded_avoids_the_busy_replica() -> None:
    config = ServiceConfig(
        replicas=2, router=LeastLoaded(), max_in_flight_per_replica=1, name="least"
    )
    async with await spawn_service(Echo, config) as svc:
        pids = await svc.pid.fanout()
        busy = asyncio.ensure_future(svc.echo.route(0, 2.0))
        await asyncio.sleep(0.1)
        loaded = next(r.index for r in svc.status().replicas if r.in_flight == 1)
        served = Counter([(await svc.echo.route(i))[1] for i in range(10)])
        assert served == {pids[1 - loaded]: 10}
        assert (await busy)[1] == pids[loaded]
        with pytest.raises(ValueError, match="LeastLoaded does not keep sessions"):
            svc.session()


class LastReplica:
    """A custom router: always the healthy replica with the highest index."""

    def pick(self, replicas: Sequence[ReplicaView], session: Hashable | None) -> ReplicaView:
        return replicas[-1]

    def end_session(self, session: Hashable) -> None:
        return None


async def test_a_custom_router_plugs_in() -> None:
    config = ServiceConfig(replicas=2, router=LastReplica(), name="custom")
    async with await spawn_service(Echo, config) as svc:
        pids = await svc.pid.fanout()
        served = {pid for _, pid in await asyncio.gather(*(svc.echo.route(i) for i in range(8)))}
        assert served == {pids[1]}


async def test_shutdown_drains_accepted_calls_and_refuses_new_ones() -> None:
    config = ServiceConfig(replicas=1, max_in_flight_per_replica=1, name="drain")
    svc = await spawn_service(Echo, config)
    assert await svc.echo.call_one(5) == (5, (await svc.pid.route()))  # one replica: call_one
    calls = [asyncio.ensure_future(svc.echo.route(i, 0.2)) for i in range(3)]
    await asyncio.sleep(0.05)
    closing = asyncio.ensure_future(svc.shutdown())
    await asyncio.sleep(0)
    with pytest.raises(ServiceClosedError):
        await svc.echo.route(9)
    await closing
    assert [(await c)[0] for c in calls] == [0, 1, 2]


async def test_shutdown_fails_what_outlasts_the_drain_timeout() -> None:
    config = ServiceConfig(replicas=1, max_in_flight_per_replica=1, drain_timeout_s=0.2)
    svc = await spawn_service(Echo, config)
    slow = asyncio.ensure_future(svc.echo.route(0, 5.0))
    queued = asyncio.ensure_future(svc.echo.route(1))
    await asyncio.sleep(0.05)
    await svc.shutdown()
    for call in (slow, queued):
        with pytest.raises(ServiceClosedError, match="shut down before answering"):
            await call
