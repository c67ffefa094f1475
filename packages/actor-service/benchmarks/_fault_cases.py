"""The fault cases of `bench_service.py`: a replica SIGKILLed (`failover`), hung (`hang`), or
its whole host killed (`hostloss`); each measures detection and recovery under a steady
stream of calls."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import cloudpickle  # type: ignore[import-untyped]
from _common import PHASE_SLACK_S, Bench, Row, deadline, quantiles
from actor_service import RoundRobin, Service, ServiceConfig, spawn_service
from monarch.actor import Actor, endpoint
from monarch.job import ProcessJob

# Its actors travel to the Monarch workers by value: they cannot import this script's folder.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

HANG_TIMEOUT_S = 1.0
SPAWN_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 5.0
# Deadlines of the waits below: far above what each takes on a loaded 2-core machine, so
# that reaching one means something is stuck, not slow.
DETECT_WITHIN_S = 60.0  # Monarch's supervision poll is 10 s by default
RECOVER_WITHIN_S = 120.0


class BenchSync(Actor):
    """Plain (sync) endpoints: the hang case needs one that blocks its replica."""

    @endpoint
    def work(self, seconds: float, hang_on: int) -> None:
        if os.getpid() == hang_on:
            time.sleep(3600)  # hung: alive, never answers
        time.sleep(seconds)


def descendants(root: int) -> set[int]:
    """Live processes below `root` (Linux /proc)."""
    parent_of: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            if fields[0] != "Z":
                parent_of[int(entry.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in parent_of.items() if parent in frontier} - found
        found |= frontier
    return found


def gone(pid: int) -> bool:
    return not alive(pid)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


async def until(condition: Callable[[], bool], what: str, within: float, svc: Service[Any]) -> None:
    """Polls every 2 ms (`status()` is a snapshot, there is no event to wait on) until
    `condition()`; `TimeoutError` naming `what`, with the service's status, after `within`."""
    stop = time.perf_counter() + within
    while not condition():
        if time.perf_counter() > stop:
            raise TimeoutError(f"{what}: not reached within {within:g} s\n{svc.status()}")
        await asyncio.sleep(0.002)


async def finish(callers: Sequence[Awaitable[None]]) -> None:
    """Waits for the stream's callers, which stop at their next call's end."""
    async with deadline(PHASE_SLACK_S, f"{len(callers)} callers finishing their last call"):
        await asyncio.gather(*callers)


async def bench_failover(kills: int) -> list[Row]:
    config = ServiceConfig(
        replicas=3,
        router=RoundRobin(),
        max_restarts=kills,
        restart_backoff_s=0.05,
        restart_backoff_max_s=0.05,
        name="failover",
    )
    detect: list[float] = []
    recover: list[float] = []
    async with await spawn_service(Bench, config) as svc:
        stop = asyncio.Event()
        served = 0

        async def caller() -> None:
            nonlocal served
            while not stop.is_set():
                await svc.sleep.route(0.01)
                served += 1

        start = time.perf_counter()
        callers = [asyncio.ensure_future(caller()) for _ in range(6)]
        for _ in range(kills):
            await asyncio.sleep(0.5)
            os.kill(svc.status().replicas[1].pids[0], signal.SIGKILL)
            t0 = time.perf_counter()
            await until(
                lambda: svc.status().replicas[1].state != "healthy",
                "killed replica 1 marked down",
                DETECT_WITHIN_S,
                svc,
            )
            detect.append((time.perf_counter() - t0) * 1e3)
            await until(
                lambda: svc.status().replicas[1].state == "healthy",
                "killed replica 1 healthy again",
                RECOVER_WITHIN_S,
                svc,
            )
            recover.append((time.perf_counter() - t0) * 1e3)
        stop.set()
        await finish(callers)
        throughput = served / (time.perf_counter() - start)
        failed = svc.status().failed
    poll = os.environ.get("HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY", "10s (default)")
    rows = []
    for case, ms in (("failover_detect", detect), ("failover_recover", recover)):
        p50, p99 = quantiles(ms)
        rows.append(Row(case, 3, p50, p99, throughput))
    print(
        f"failover ({kills} SIGKILLs, supervision poll {poll}): detected in p50 "
        f"{rows[0].p50_ms:.0f} ms (max {max(detect):.0f}), healthy again in p50 "
        f"{rows[1].p50_ms:.0f} ms (max {max(recover):.0f}); {served} calls served, "
        f"{failed} failed"
    )
    return rows


async def bench_hang(hangs: int) -> list[Row]:
    config = ServiceConfig(
        replicas=3,
        router=RoundRobin(),
        call_timeout_s=HANG_TIMEOUT_S,
        max_restarts=hangs,
        restart_backoff_s=0.05,
        restart_backoff_max_s=0.05,
        name="hang",
    )
    detect: list[float] = []
    stopped: list[float] = []
    recover: list[float] = []
    async with await spawn_service(BenchSync, config) as svc:
        stop = asyncio.Event()
        served = 0
        hang_on = -1  # the callers' calls block forever in this process

        async def caller() -> None:
            nonlocal served
            while not stop.is_set():
                await svc.work.route(0.01, hang_on)
                served += 1

        start = time.perf_counter()
        callers = [asyncio.ensure_future(caller()) for _ in range(6)]
        for _ in range(hangs):
            await asyncio.sleep(0.5)
            victim = svc.status().replicas[1].pids[0]
            hang_on = victim
            t0 = time.perf_counter()
            await until(
                lambda: svc.status().replicas[1].state != "healthy",
                "hung replica 1 marked down",
                DETECT_WITHIN_S,
                svc,
            )
            detect.append((time.perf_counter() - t0) * 1e3)
            await until(
                functools.partial(gone, victim),
                f"hung process {victim} gone",
                RECOVER_WITHIN_S,
                svc,
            )
            stopped.append((time.perf_counter() - t0) * 1e3)
            await until(
                lambda: svc.status().replicas[1].state == "healthy",
                "hung replica 1 healthy again",
                RECOVER_WITHIN_S,
                svc,
            )
            recover.append((time.perf_counter() - t0) * 1e3)
            hang_on = -1
        stop.set()
        await finish(callers)
        throughput = served / (time.perf_counter() - start)
        status = svc.status()
    rows = [
        Row(case, 3, *quantiles(ms), throughput)
        for case, ms in (
            ("hang_detect", detect),
            ("hang_stopped", stopped),
            ("hang_recover", recover),
        )
    ]
    print(
        f"hang ({hangs} hung replicas, call_timeout_s={HANG_TIMEOUT_S:g}): marked down in p50 "
        f"{rows[0].p50_ms:.0f} ms (max {max(detect):.0f}), process gone in p50 "
        f"{rows[1].p50_ms:.0f} ms (max {max(stopped):.0f}), healthy again in p50 "
        f"{rows[2].p50_ms:.0f} ms (max {max(recover):.0f}); {served} calls served, "
        f"{status.failed} failed, {status.hangs} hangs counted"
    )
    return rows


async def bench_host_loss() -> list[Row]:
    job = ProcessJob({"a": 1, "b": 1})
    config = ServiceConfig(
        replicas=2,
        router=RoundRobin(),
        call_timeout_s=HANG_TIMEOUT_S,
        restart_backoff_s=0.05,
        spawn_timeout_s=SPAWN_TIMEOUT_S,
        stop_timeout_s=STOP_TIMEOUT_S,
        name="hostloss",
    )
    try:
        state: Any = job.state(cached_path=None)
        svc = await spawn_service(Bench, config, hosts=[state.a, state.b])
        try:
            stop = asyncio.Event()
            served = 0

            async def caller() -> None:
                nonlocal served
                while not stop.is_set():
                    await svc.sleep.route(0.01)
                    served += 1

            start = time.perf_counter()
            callers = [asyncio.ensure_future(caller()) for _ in range(4)]
            await asyncio.sleep(0.5)
            # The whole host goes, as a machine would: its worker and every process under it.
            worker = job._host_to_pid["a_0"].pid
            for pid in {worker, *descendants(worker)}:
                os.kill(pid, signal.SIGKILL)
            t0 = time.perf_counter()
            await until(
                lambda: svc.status().replicas[0].state != "healthy",
                "replica 0 of the killed host a marked down",
                DETECT_WITHIN_S,
                svc,
            )
            detect = (time.perf_counter() - t0) * 1e3
            await until(
                lambda: svc.status().replicas[0].state == "healthy",
                "replica 0 of the killed host a healthy again",
                RECOVER_WITHIN_S,
                svc,
            )
            recover = (time.perf_counter() - t0) * 1e3
            stop.set()
            await finish(callers)
            throughput = served / (time.perf_counter() - start)
            status = svc.status()
            # Printed before shutdown, so that a slow shutdown cannot hide the respawn.
            print(
                f"hostloss (host a SIGKILLed, call_timeout_s={HANG_TIMEOUT_S:g}, "
                f"spawn_timeout_s={SPAWN_TIMEOUT_S:g}): its replica marked down in "
                f"{detect:.0f} ms, respawned and healthy on host {status.replicas[0].host} "
                f"{recover:.0f} ms after the kill (hosts down {list(status.hosts_down)}); "
                f"{served} calls served, {status.failed} failed",
                flush=True,
            )
        finally:
            t1 = time.perf_counter()
            await svc.shutdown()
            shutdown = (time.perf_counter() - t1) * 1e3
    finally:
        job.kill()  # type: ignore[no-untyped-call]
    print(f"hostloss: shutdown took {shutdown:.0f} ms (stop_timeout_s={STOP_TIMEOUT_S:g})")
    return [
        Row("hostloss_detect", 2, detect, detect, throughput),
        Row("hostloss_recover", 2, recover, recover, throughput),
        Row("hostloss_shutdown", 2, shutdown, shutdown, throughput),
    ]
