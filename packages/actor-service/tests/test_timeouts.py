"""Hung replicas, with real processes: a replica whose endpoint blocks forever (a sync
`time.sleep(3600)` in one replica process) is found by the per-call timeout, stopped for
real and restarted; its calls are answered by another replica, or fail with
`CallTimeoutError` when they must not be re-sent. The test process is the controller: if
stopping the hung replica escaped the service, Monarch would exit it here."""

from __future__ import annotations

import asyncio

import pytest
from actor_service import (
    CallTimeoutError,
    ReplicaEvent,
    RoundRobin,
    ServiceConfig,
    ServiceError,
    spawn_service,
)
from helpers import Recorder, wait_until
from procs import alive, descendants
from service_actors import Stuck

# Several processes, seconds each: not in `nox -s fast`.
pytestmark = pytest.mark.slow

TIMEOUT_S = 3.0  # long beside a no-op call even on a loaded machine, short for a test


async def test_a_hung_replica_is_stopped_and_restarted_and_its_calls_answered_elsewhere() -> None:
    config = ServiceConfig(
        replicas=2,
        router=RoundRobin(),
        call_timeout_s=TIMEOUT_S,
        restart_backoff_s=0.3,
        name="hang",
    )
    alive_at_delivery: list[bool] = []

    def look(event: ReplicaEvent) -> None:
        if event.kind == "died":
            alive_at_delivery.extend(alive(pid) for pid in event.pids)

    async with await spawn_service(Stuck, config) as svc:
        seen = Recorder()
        svc.add_listener(seen)
        svc.add_listener(look)
        pids = await svc.pid.fanout()
        # Round-robin: calls 0 and 2 go to replica 0, where the first blocks forever and
        # the second waits behind it; 1 and 3 go to replica 1.
        results = await asyncio.gather(*(svc.work.route(i, pids[0]) for i in range(4)))
        assert results == [(i, pids[1]) for i in range(4)]  # one answer each, from replica 1

        status = svc.status()
        hung = status.replicas[0]
        assert (hung.hangs, hung.deaths, hung.lost) == (1, 1, 2)
        assert status.retried == 2
        assert (status.hangs, status.replicas[1].hangs, status.replicas[1].deaths) == (1, 0, 0)
        assert "hangs 1" in str(status)

        died, up = await seen.wait_for(2)
        assert seen.kinds() == [(0, "died"), (0, "up")]
        assert died.reason == (
            f"hung: no answer to `work` within {TIMEOUT_S:g} s, so its processes are stopped"
        )
        # The hung process is named, and was still there for the listener to look at.
        assert died.pids == (pids[0],)
        assert alive_at_delivery == [True]
        assert up.restarts == 1
        assert up.pids != died.pids
        status = await wait_until(svc, lambda s: s.healthy == 2)
        reborn = status.replicas[0]
        assert (reborn.generation, reborn.restarts) == (1, 1)
        assert reborn.pids[0] != pids[0]
        await wait_until(svc, lambda s: not alive(pids[0]))  # stopped for real, not left hung
        assert await svc.pid.fanout() == [reborn.pids[0], pids[1]]


@pytest.mark.parametrize("case", ["non-idempotent", "retries spent"])
async def test_a_timed_out_call_that_cannot_be_resent_gets_call_timeout_error(case: str) -> None:
    endpoint, retries = ("pay", 2) if case == "non-idempotent" else ("work", 0)
    config = ServiceConfig(
        replicas=2,
        router=RoundRobin(),
        call_timeout_s=TIMEOUT_S,
        max_retries=retries,
        restart_backoff_s=0.3,
        name="tmo",
    )
    async with await spawn_service(Stuck, config) as svc:
        pids = await svc.pid.fanout()
        call = svc.endpoint(endpoint).route
        outs = await asyncio.gather(call(0, pids[0]), call(1, pids[0]), return_exceptions=True)
        errors = [e for e in outs if isinstance(e, BaseException)]
        assert len(errors) == 1, outs
        error = errors[0]
        assert isinstance(error, CallTimeoutError)
        assert isinstance(error, ServiceError)
        message = str(error)
        assert f"service tmo: replica 0 gave no answer to `{endpoint}`" in message
        assert f"within its timeout of {TIMEOUT_S:g} s" in message
        assert "taken as hung and stopped" in message
        if case == "non-idempotent":
            assert "non-idempotent, so it was not re-sent" in message
        else:
            assert "it was sent 1 time (max_retries=0)" in message
        assert [pid for _, pid in (o for o in outs if not isinstance(o, BaseException))] == [
            pids[1]
        ]
        status = await wait_until(svc, lambda s: s.healthy == 2)
        assert status.replicas[0].hangs == 1
        assert status.replicas[0].pids[0] != pids[0]


async def test_calls_within_their_timeout_are_never_affected() -> None:
    config = ServiceConfig(
        call_timeout_s=TIMEOUT_S, endpoint_timeouts=(("slow", 60.0),), name="patient"
    )
    async with await spawn_service(Stuck, config) as svc:
        [pid] = await svc.pid.fanout()
        # Each runs 2 s, under the timeout; the second waits 2 s behind the first in the
        # replica's mailbox, so it answers 4 s after it was sent: its clock starts only
        # when the first is answered.
        queued = await asyncio.gather(svc.work.route(1, -1, 2.0), svc.work.route(2, -1, 2.0))
        assert list(queued) == [(1, pid), (2, pid)]
        assert await svc.slow.route(TIMEOUT_S + 2.0) == pid  # its own timeout is 60 s
        outs = await asyncio.gather(*(svc.work.route(i) for i in range(40)))
        assert outs == [(i, pid) for i in range(40)]
        await asyncio.sleep(TIMEOUT_S + 1.0)  # a timer left behind would fire by now
        status = svc.status()
        assert (status.hangs, status.deaths, status.replicas[0].pids) == (0, 0, (pid,))
        assert status.completed == 44  # with the first `pid` call


async def test_a_timeout_for_an_unknown_endpoint_is_refused_before_anything_starts() -> None:
    before = descendants()
    config = ServiceConfig(endpoint_timeouts=(("generate", 5.0),), name="typo")
    with pytest.raises(ValueError, match=r"ServiceConfig.endpoint_timeouts names \['generate'\]"):
        await spawn_service(Stuck, config)
    assert descendants() - before == set()
