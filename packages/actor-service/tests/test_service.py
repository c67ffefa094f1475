"""Routing, sessions, errors, metrics and handles on real replica processes.

One 3-replica service is shared by the module (its tests leave it healthy); tests that need
other settings spawn their own and stop it.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from actor_service import (
    ReplicaStartError,
    RoundRobin,
    Service,
    ServiceClosedError,
    ServiceConfig,
    Sticky,
    spawn_service,
)
from helpers import wait_until
from monarch.actor import ActorError, this_host
from procs import alive, descendants
from service_actors import BrokenInit, Caller, Echo

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def svc() -> AsyncIterator[Service[Echo]]:
    config = ServiceConfig(replicas=3, router=Sticky(fallback=RoundRobin()), name="echo")
    service = await spawn_service(Echo, config, "shared")
    yield service
    await service.shutdown()


async def test_fanout_answers_from_every_replica_in_replica_order(svc: Service[Echo]) -> None:
    pids = await svc.pid.fanout()
    assert pids == [r.pids[0] for r in svc.status().replicas]
    assert len(set(pids)) == 3


async def test_round_robin_route_spreads_calls_evenly(svc: Service[Echo]) -> None:
    pids = await svc.pid.fanout()
    served = Counter([(await svc.echo.route(i))[1] for i in range(60)])
    assert served == dict.fromkeys(pids, 20)
    # Concurrent callers too: every call is answered, each replica takes its third.
    outs = await asyncio.gather(*(svc.echo.route(i) for i in range(90)))
    assert [x for x, _ in outs] == list(range(90))
    assert Counter(pid for _, pid in outs) == dict.fromkeys(pids, 30)


async def test_sessions_stick_to_one_replica(svc: Service[Echo]) -> None:
    async with svc.session() as a, svc.session() as b:
        a_pids = {(await a.echo.route(i))[1] for i in range(15)}
        b_pids = {(await b.echo.route(i))[1] for i in range(15)}
        # Calls outside the sessions keep rotating meanwhile.
        outside = {(await svc.echo.route(i))[1] for i in range(6)}
    assert len(a_pids) == 1
    assert len(b_pids) == 1
    assert a_pids != b_pids
    assert len(outside) == 3


async def test_endpoint_error_is_reraised_with_remote_traceback(svc: Service[Echo]) -> None:
    before = svc.status()
    with pytest.raises(ActorError) as info:
        await svc.divide.route(1.0, 0.0)
    assert isinstance(info.value.exception, ZeroDivisionError)
    assert "Traceback of where the remote call failed" in str(info.value)
    assert "in divide" in str(info.value)  # the frame of the endpoint that raised
    after = svc.status()
    assert after.healthy == 3  # an application error does not mark a replica unhealthy
    assert [r.pids for r in after.replicas] == [r.pids for r in before.replicas]
    assert after.failed == before.failed + 1
    assert await svc.divide.route(6.0, 3.0) == 2.0


async def test_typed_endpoint_access_and_bad_names(svc: Service[Echo]) -> None:
    divide = svc.endpoint(Echo.divide)
    result: float = await divide.route(1.0, 4.0)
    assert result == 0.25
    assert svc.endpoint("divide") is divide
    with pytest.raises(AttributeError, match="no endpoint 'generate'"):
        svc.generate  # noqa: B018
    with pytest.raises(ValueError, match="call_one is for a single-replica service"):
        await svc.pid.call_one()


async def test_status_counts_and_latency(svc: Service[Echo]) -> None:
    before = svc.status().completed
    await asyncio.gather(*(svc.echo.route(i) for i in range(30)))
    status = svc.status()
    assert status.completed == before + 30
    assert status.healthy == 3
    assert status.in_flight == 0
    assert status.queued == 0
    assert 0 < status.p50_ms <= status.p99_ms
    assert all(r.state == "healthy" and r.generation == 0 for r in status.replicas)
    assert "3/3 healthy" in str(status)


async def test_handle_lets_another_actor_use_the_service(svc: Service[Echo]) -> None:
    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        caller = procs.spawn("caller", Caller, svc.handle())
        pids = set(await svc.pid.fanout())
        assert set(await caller.echo_many.call_one(30)) == pids
        sticky = await caller.in_session.call_one(10)
        assert len(set(sticky)) == 1
        error = await caller.error_of_divide.call_one()
        assert error.startswith("ActorError:ZeroDivisionError:")
    finally:
        await procs.stop()


async def test_multi_process_replicas_run_every_rank_and_pin_gpus() -> None:
    config = ServiceConfig(replicas=2, procs_per_replica=2, with_gpus=True, name="tp")
    async with await spawn_service(Echo, config) as svc:
        assert [len(r.pids) for r in svc.status().replicas] == [2, 2]
        # route answers with rank 0's result; each process sees one GPU of its replica's
        # block: replica i, rank r -> GPU 2 * i + r.
        assert await svc.env.fanout("CUDA_VISIBLE_DEVICES") == [(0, "0"), (0, "2")]
        meshes = svc.replica_meshes()
        ranks = [
            sorted(v for _, v in (await m.env.call("CUDA_VISIBLE_DEVICES")).items()) for m in meshes
        ]
        assert ranks == [[(0, "0"), (1, "1")], [(0, "2"), (1, "3")]]
        pids = [p for r in svc.status().replicas for p in r.pids]
    assert not any(alive(p) for p in pids)


async def test_gpu_blocks_start_at_first_gpu_and_hold_several_gpus_per_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A tensor-parallel engine in one process needs several GPUs; a trainer holds the first
    # two of this machine. The parent's CUDA_VISIBLE_DEVICES is the list the indices count in.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7,6,5,4,3,2")
    config = ServiceConfig(
        replicas=2, with_gpus=True, gpus_per_proc=2, first_gpu=2, name="tp2", max_restarts=1
    )
    async with await spawn_service(Echo, config) as svc:
        assert sorted(v for _, v in await svc.env.fanout("CUDA_VISIBLE_DEVICES")) == [
            "3,2",  # replica 1: GPUs 4 and 5 of the list
            "5,4",  # replica 0: GPUs 2 and 3 of the list
        ]
        # A restarted replica gets its GPUs back.
        (pid,) = svc.status().replicas[0].pids
        os.kill(pid, signal.SIGKILL)
        await wait_until(svc, lambda st: st.healthy == 2 and st.replicas[0].deaths == 1)
        assert sorted(v for _, v in await svc.env.fanout("CUDA_VISIBLE_DEVICES")) == ["3,2", "5,4"]


async def test_failing_init_is_a_clear_error_and_leaves_no_process() -> None:
    before = descendants()
    with pytest.raises(ReplicaStartError, match="model file missing") as info:
        await spawn_service(BrokenInit, ServiceConfig(replicas=2, name="broken"))
    assert "BrokenInit failed to start" in str(info.value)
    assert descendants() <= before  # every process it started is gone


async def test_shutdown_stops_every_process_and_refuses_calls() -> None:
    svc = await spawn_service(Echo, ServiceConfig(replicas=2, name="short"))
    pids = [p for r in svc.status().replicas for p in r.pids]
    assert all(alive(p) for p in pids)
    await svc.shutdown()
    await svc.shutdown()  # idempotent
    assert not any(alive(p) for p in pids)
    with pytest.raises(ServiceClosedError):
        await svc.pid.route()
    assert svc.status().closed
