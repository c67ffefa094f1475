"""Replica lifecycle events (`Service.add_listener`) and the death / restart counters of
`status()`, with replicas killed for real (SIGKILL from outside)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from actor_service import ReplicaEvent, RoundRobin, Service, ServiceConfig, spawn_service
from helpers import Recorder
from service_actors import Echo, StartsOnce

# Several processes, seconds each: not in `nox -s fast`.
pytestmark = pytest.mark.slow


def kill_replica(svc: Service[Any], index: int) -> int:
    pid = svc.status().replicas[index].pids[0]
    os.kill(pid, signal.SIGKILL)
    return pid


async def test_a_killed_replica_is_told_as_died_then_up() -> None:
    config = ServiceConfig(replicas=2, router=RoundRobin(), restart_backoff_s=0.3, name="ev")
    async with await spawn_service(Echo, config) as svc:
        seen = Recorder()
        svc.add_listener(seen)
        killed_at = time.time()
        victim = kill_replica(svc, 1)
        died, up = await seen.wait_for(2)
        assert seen.kinds() == [(1, "died"), (1, "up")]
        assert (died.service, died.restarts, died.down_s) == ("ev", 0, None)
        assert "\n" not in died.reason
        assert "sig=9" in died.reason
        assert killed_at <= died.at <= up.at
        assert up.restarts == 1
        assert up.reason == died.reason
        # down_s runs from the death the service learned of to the replica serving again,
        # which includes the 0.3 s restart backoff.
        assert up.down_s is not None
        assert up.down_s >= 0.3
        assert up.down_s == pytest.approx(up.at - died.at, abs=0.01)
        assert seen.threads == {threading.get_ident()}  # on the service's loop

        status = svc.status()
        assert [(r.deaths, r.restarts, r.generation) for r in status.replicas] == [
            (0, 0, 0),
            (1, 1, 1),
        ]
        assert (status.deaths, status.restarts) == (1, 1)
        assert victim not in status.replicas[1].pids
        assert "deaths 1 hangs 0 restarts 1" in str(status)
        served = {pid for _, pid in await asyncio.gather(*(svc.echo.route(i) for i in range(4)))}
        assert served == {r.pids[0] for r in status.replicas}
        await asyncio.sleep(1.0)
        assert len(seen.events) == 2  # nothing more happened, so nothing more is told


async def test_a_death_with_the_restart_budget_spent_is_told_as_gave_up() -> None:
    config = ServiceConfig(replicas=2, max_restarts=1, restart_backoff_s=0.1, name="budget")
    async with await spawn_service(Echo, config) as svc:
        seen = Recorder()
        svc.add_listener(seen)
        kill_replica(svc, 0)
        await seen.wait_for(2)
        kill_replica(svc, 0)
        events = await seen.wait_for(4)
        assert seen.kinds() == [(0, "died"), (0, "up"), (0, "died"), (0, "gave_up")]
        assert [e.restarts for e in events] == [0, 1, 1, 1]
        assert events[3].reason == events[2].reason
        await asyncio.sleep(1.0)
        status = svc.status()
        assert len(seen.events) == 4
        assert (status.replicas[0].state, status.replicas[0].deaths) == ("failed", 2)
        assert (status.replicas[0].restarts, status.replicas[0].generation) == (1, 1)
        assert (status.replicas[1].deaths, status.replicas[1].restarts) == (0, 0)


async def test_restarts_that_all_fail_end_in_gave_up(tmp_path: Path) -> None:
    config = ServiceConfig(replicas=1, max_restarts=2, restart_backoff_s=0.1, name="once")
    async with await spawn_service(StartsOnce, config, str(tmp_path / "started")) as svc:
        seen = Recorder()
        svc.add_listener(seen)
        kill_replica(svc, 0)
        events = await seen.wait_for(2)
        assert seen.kinds() == [(0, "died"), (0, "gave_up")]
        assert events[1].restarts == 2  # both attempts were made
        assert "refusing to start twice" in events[1].reason
        status = svc.status()
        assert (status.replicas[0].state, status.replicas[0].deaths) == ("failed", 1)
        assert status.replicas[0].restarts == 2


async def test_a_raising_listener_breaks_nothing(caplog: pytest.LogCaptureFixture) -> None:
    def broken(event: ReplicaEvent) -> None:
        raise RuntimeError(f"listener bug on {event.kind}")

    config = ServiceConfig(replicas=1, restart_backoff_s=0.1, name="sturdy")
    async with await spawn_service(Echo, config) as svc:
        seen = Recorder()
        svc.add_listener(broken)
        svc.add_listener(seen)  # after the broken one: still told
        with caplog.at_level(logging.ERROR, logger="actor_service"):
            kill_replica(svc, 0)
            await seen.wait_for(2)
        assert seen.kinds() == [(0, "died"), (0, "up")]
        logged = [r for r in caplog.records if r.exc_info and "listener" in r.getMessage()]
        assert [str(r.exc_info[1]) for r in logged if r.exc_info] == [
            "listener bug on died",
            "listener bug on up",
        ]
        assert (await svc.echo.route(5))[0] == 5
        assert svc.status().replicas[0].state == "healthy"


async def test_listeners_must_be_plain_callables() -> None:
    async def coroutine_listener(event: ReplicaEvent) -> None:
        pass

    async with await spawn_service(Echo, ServiceConfig(name="picky")) as svc:
        with pytest.raises(TypeError, match="is async"):
            svc.add_listener(coroutine_listener)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="must be callable"):
            svc.add_listener("print")  # type: ignore[arg-type]
