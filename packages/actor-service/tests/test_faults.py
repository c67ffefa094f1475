"""Fault injection with real processes: replicas are killed (`os._exit` inside an endpoint,
SIGKILL from outside) while calls stream through. The test process is the controller: if a
replica failure escaped the service, Monarch would exit it and the run would stop here.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from collections.abc import Callable

import pytest
from actor_service import (
    NoHealthyReplicaError,
    ReplicaDiedError,
    RoundRobin,
    Service,
    ServiceConfig,
    ServiceStatus,
    spawn_service,
)
from procs import alive
from service_actors import Echo

# Several processes, seconds each: not in `nox -s fast`.
pytestmark = pytest.mark.slow

# Monarch notices a dead process at its next supervision poll (1 s in these tests, see
# conftest.py; 10 s by default), so waits allow for generous multiples of that.
RECOVERY_S = 60.0


async def wait_until(svc: Service[Echo], ok: Callable[[ServiceStatus], bool]) -> ServiceStatus:
    deadline = time.monotonic() + RECOVERY_S
    while time.monotonic() < deadline:
        status = svc.status()
        if ok(status):
            return status
        await asyncio.sleep(0.05)
    raise AssertionError(f"condition not reached within {RECOVERY_S} s:\n{svc.status()}")


@pytest.mark.parametrize("kill", ["os._exit inside", "SIGKILL outside"])
async def test_kill_mid_stream_every_call_completes_exactly_once(kill: str) -> None:
    config = ServiceConfig(replicas=3, router=RoundRobin(), restart_backoff_s=0.1, name="stream")
    async with await spawn_service(Echo, config) as svc:
        pids = await svc.pid.fanout()
        victim = pids[1]
        workers, per_worker = 12, 20  # 240 calls, 12 in the air at any time
        done = 0
        halfway = asyncio.Event()
        crash_on = victim if kill == "os._exit inside" else -1

        async def worker(w: int) -> list[tuple[int, int]]:
            nonlocal done
            results = []
            for k in range(per_worker):
                # Halfway through, every worker sends one call that kills the victim's
                # process from inside if it lands there (the first one does).
                poison = crash_on if k == per_worker // 2 else -1
                results.append(await svc.echo.route(w * per_worker + k, 0.01, poison))
                done += 1
                if done == 100:
                    halfway.set()
            return results

        async def killer() -> None:
            await halfway.wait()
            os.kill(victim, signal.SIGKILL)

        tasks = [worker(w) for w in range(workers)]
        if kill == "SIGKILL outside":
            tasks.append(killer())  # type: ignore[arg-type]
        outcomes = await asyncio.gather(*tasks)
        results = [r for worker_results in outcomes[:workers] for r in worker_results]

        # Every call returned exactly one result, its own.
        assert sorted(x for x, _ in results) == list(range(workers * per_worker))
        assert not alive(victim)
        status = svc.status()
        assert status.replicas[1].lost >= 1  # calls were in flight on the victim...
        assert status.retried >= 1  # ...and were sent again elsewhere
        assert status.failed == 0

        # The replica comes back as a new process and the service serves on all three.
        status = await wait_until(svc, lambda s: s.healthy == 3)
        reborn = status.replicas[1]
        assert reborn.generation == 1
        assert reborn.restarts == 1
        assert reborn.pids[0] not in pids
        after = await asyncio.gather(*(svc.echo.route(i) for i in range(30)))
        assert Counter(pid for _, pid in after) == {pids[0]: 10, reborn.pids[0]: 10, pids[2]: 10}


@pytest.mark.parametrize("declared_by", ["decorator", "config"])
async def test_non_idempotent_call_in_flight_is_not_retried_but_queued_ones_move(
    declared_by: str,
) -> None:
    # `charge` is marked @non_idempotent in the actor; `transfer` is named in the config.
    endpoint, extra = ("charge", ()) if declared_by == "decorator" else ("transfer", ("transfer",))
    config = ServiceConfig(
        replicas=2,
        router=RoundRobin(),
        max_in_flight_per_replica=1,
        non_idempotent=extra,
        name="bank",
    )
    async with await spawn_service(Echo, config) as svc:
        pids = await svc.pid.fanout()
        call = svc.endpoint(endpoint).route
        first = asyncio.ensure_future(call(1, 30.0))  # in flight on replica 0
        second = asyncio.ensure_future(call(2, 0.0))  # replica 1
        third = asyncio.ensure_future(call(3, 0.0))  # queued behind `first`
        await wait_until(svc, lambda s: s.replicas[0].in_flight == 1 and s.replicas[0].queued == 1)
        os.kill(pids[0], signal.SIGKILL)
        with pytest.raises(ReplicaDiedError, match="non-idempotent, so it was not retried"):
            await first
        # `third` was never sent to the dead replica, so it could safely move.
        assert await second == 2
        assert await third == 3


async def test_retries_are_bounded() -> None:
    config = ServiceConfig(replicas=2, router=RoundRobin(), max_retries=0, name="noretry")
    async with await spawn_service(Echo, config) as svc:
        pids = await svc.pid.fanout()
        lost = asyncio.ensure_future(svc.echo.route(0, 30.0))  # in flight on replica 0
        await wait_until(svc, lambda s: s.replicas[0].in_flight == 1)
        os.kill(pids[0], signal.SIGKILL)
        with pytest.raises(ReplicaDiedError, match=r"max_retries=0"):
            await lost


async def test_fanout_leaves_out_a_replica_that_dies_during_the_call() -> None:
    config = ServiceConfig(replicas=3, restart_backoff_s=0.1, name="fan")
    async with await spawn_service(Echo, config) as svc:
        pids = await svc.pid.fanout()
        call = asyncio.ensure_future(svc.echo.fanout(7, 2.0))
        await wait_until(svc, lambda s: s.in_flight == 3)
        os.kill(pids[1], signal.SIGKILL)
        assert await call == [(7, pids[0]), (7, pids[2])]


async def test_restart_limit_is_honoured() -> None:
    config = ServiceConfig(
        replicas=2, router=RoundRobin(), max_restarts=2, restart_backoff_s=0.1, name="limit"
    )
    async with await spawn_service(Echo, config) as svc:
        survivor = svc.status().replicas[1].pids[0]
        for kill in range(3):
            victim = svc.status().replicas[0].pids[0]
            os.kill(victim, signal.SIGKILL)
            if kill < 2:  # within budget: replica 0 comes back as a new generation
                generation = kill + 1

                def back(s: ServiceStatus, g: int = generation) -> bool:
                    return s.replicas[0].generation == g and s.healthy == 2

                status = await wait_until(svc, back)
                assert status.replicas[0].restarts == kill + 1
        status = await wait_until(svc, lambda s: s.replicas[0].state == "failed")
        assert status.replicas[0].restarts == 2  # no third restart
        assert status.replicas[0].generation == 2
        assert status.healthy == 1
        await asyncio.sleep(1.0)  # longer than any backoff: still no restart
        assert svc.status().replicas[0].state == "failed"
        # The service keeps serving on the replica that is left.
        served = {pid for _, pid in await asyncio.gather(*(svc.echo.route(i) for i in range(20)))}
        assert served == {survivor}


async def test_no_replica_that_can_come_back_fails_at_once() -> None:
    config = ServiceConfig(replicas=1, max_restarts=0, no_healthy_timeout_s=30.0, name="lone")
    async with await spawn_service(Echo, config) as svc:
        os.kill(svc.status().replicas[0].pids[0], signal.SIGKILL)
        await wait_until(svc, lambda s: s.replicas[0].state == "failed")
        start = time.monotonic()
        with pytest.raises(NoHealthyReplicaError, match="none can come back"):
            await svc.echo.route(1)
        assert time.monotonic() - start < 1.0


async def test_no_healthy_replica_times_out_then_serves_again() -> None:
    config = ServiceConfig(
        replicas=1, restart_backoff_s=4.0, no_healthy_timeout_s=0.5, name="slowback"
    )
    async with await spawn_service(Echo, config) as svc:
        os.kill(svc.status().replicas[0].pids[0], signal.SIGKILL)
        await wait_until(svc, lambda s: s.replicas[0].state == "restarting")
        start = time.monotonic()
        with pytest.raises(NoHealthyReplicaError, match=r"no_healthy_timeout_s=0\.5"):
            await svc.echo.route(1)
        assert 0.5 <= time.monotonic() - start < 3.0
        await wait_until(svc, lambda s: s.healthy == 1)
        assert (await svc.echo.route(2))[0] == 2
