"""Benchmarks of actor-service: routing overhead, scaling with replicas, failover time.

    uv run python packages/actor-service/benchmarks/bench_service.py [--quick] [--json PATH]
        [--cases overhead,scale,failover,hang,hostloss]
    uv run nox -s "bench(package='actor-service')" -- --json out.json

Cases (one JSON row each: case, replicas, p50_ms, p99_ms, throughput in calls/s):
  direct   a no-op endpoint called with Monarch's `call_one` on the replica's own mesh,
           one call at a time (the baseline).
  route    the same endpoint through `service.noop.route()`, interleaved with `direct`
           so both see the same machine load. Goal: <= 1.3x direct and <= 0.5 ms added.
  scale    a sleep-bound endpoint (sleeps SLEEP_S) driven by 4 callers per replica, for
           1, 2, 4, 8 replicas. Goal: throughput >= 0.9 x N x the 1-replica throughput.
  failover 3 replicas under a steady stream of calls; one replica is SIGKILLed, several
           times. p50/p99 are over the kills: `failover_detect` is kill -> replica marked
           down, `failover_recover` is kill -> replica healthy again. Detection time is
           Monarch's supervision poll period, from HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY
           (default 10 s; it must be set before Python starts).
  hang     3 replicas under a steady stream of calls, `call_timeout_s=HANG_TIMEOUT_S`; one
           replica is made to hang (the next call it gets blocks forever), several times.
           `hang_detect` is hang -> replica marked down (the timeout plus how long the next
           call takes to reach it), `hang_stopped` is hang -> the hung process is gone,
           `hang_recover` is hang -> replica healthy again.
  hostloss 2 replicas on two local hosts (Monarch's `ProcessJob`), `call_timeout_s=
           HANG_TIMEOUT_S`, `spawn_timeout_s=SPAWN_TIMEOUT_S`; every process of host a (its
           worker and the replica it runs) is SIGKILLed once. `hostloss_detect` is kill ->
           the replica on it marked down, `hostloss_recover` is kill -> that replica
           healthy again on host b (the respawn first tries host a, given up on after
           `spawn_timeout_s`), `hostloss_shutdown` is how long `shutdown()` then takes
           (its stop of the dead host's replica is given up on after `stop_timeout_s`).

Every wait has a deadline (a case that does not get there raises `TimeoutError` saying what
it waited for, how long, and the service's status). Ratios are measured within one run; on
a shared machine absolute numbers move with load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import signal
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from actor_service import RoundRobin, Service, ServiceConfig, spawn_service
from monarch.actor import Actor, endpoint
from monarch.job import ProcessJob

SLEEP_S = 0.05
HANG_TIMEOUT_S = 1.0
SPAWN_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 5.0
# Deadlines of the waits below: far above what each takes on a loaded 2-core machine, so
# that reaching one means something is stuck, not slow.
DETECT_WITHIN_S = 60.0  # Monarch's supervision poll is 10 s by default
RECOVER_WITHIN_S = 120.0
PHASE_SLACK_S = 120.0  # beyond a phase's planned length


class Bench(Actor):
    @endpoint
    async def noop(self) -> None:
        return None

    @endpoint
    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


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


@contextlib.asynccontextmanager
async def deadline(seconds: float, what: str) -> AsyncIterator[None]:
    """Bounds a phase: `TimeoutError` naming `what` if it is not done within `seconds`."""
    limit = asyncio.timeout(seconds)
    try:
        async with limit:
            yield
    except TimeoutError:
        if limit.expired():
            raise TimeoutError(f"{what}: not done within {seconds:g} s") from None
        raise


def gone(pid: int) -> bool:
    return not alive(pid)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


@dataclass
class Row:
    case: str
    replicas: int
    p50_ms: float
    p99_ms: float
    throughput: float


def quantiles(ms: list[float]) -> tuple[float, float]:
    ordered = sorted(ms)
    return ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


async def bench_overhead(calls: int) -> list[Row]:
    async with await spawn_service(Bench, ServiceConfig(replicas=1, name="overhead")) as svc:
        mesh = svc.replica_meshes()[0]
        direct: list[float] = []
        routed: list[float] = []
        # One deadline for the whole loop: one per call would add its own cost to both.
        async with deadline(PHASE_SLACK_S + calls * 0.05, f"{calls} no-op call pairs"):
            for _ in range(200):  # warm up both paths
                await mesh.noop.call_one()
                await svc.noop.route()
            for _ in range(calls):
                t0 = time.perf_counter()
                await mesh.noop.call_one()
                t1 = time.perf_counter()
                await svc.noop.route()
                t2 = time.perf_counter()
                direct.append((t1 - t0) * 1e3)
                routed.append((t2 - t1) * 1e3)
    rows = []
    for case, ms in (("direct", direct), ("route", routed)):
        p50, p99 = quantiles(ms)
        rows.append(Row(case, 1, p50, p99, 1e3 / statistics.fmean(ms)))
    d, r = rows
    print(
        f"route overhead: p50 {r.p50_ms:.3f} ms vs direct {d.p50_ms:.3f} ms "
        f"= {r.p50_ms / d.p50_ms:.2f}x, +{r.p50_ms - d.p50_ms:.3f} ms per call "
        f"(goal <= 1.3x and <= 0.5 ms)"
    )
    return rows


async def drive(svc: Service[Bench], callers: int, seconds: float) -> tuple[list[float], float]:
    """`callers` loops calling `sleep` for `seconds`; (latencies ms, calls/s)."""
    latencies: list[float] = []
    stop = time.perf_counter() + seconds

    async def caller() -> None:
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            await svc.sleep.route(SLEEP_S)
            latencies.append((time.perf_counter() - t0) * 1e3)

    start = time.perf_counter()
    async with deadline(seconds + PHASE_SLACK_S, f"{callers} callers of `sleep` for {seconds:g} s"):
        await asyncio.gather(*(caller() for _ in range(callers)))
    return latencies, len(latencies) / (time.perf_counter() - start)


async def bench_scaling(sizes: list[int], seconds: float) -> list[Row]:
    rows = []
    for n in sizes:
        config = ServiceConfig(replicas=n, name=f"scale{n}")
        async with await spawn_service(Bench, config) as svc:
            await drive(svc, 4 * n, 0.3)  # warm up
            latencies, throughput = await drive(svc, 4 * n, seconds)
        p50, p99 = quantiles(latencies)
        rows.append(Row("scale", n, p50, p99, throughput))
        base = rows[0].throughput
        print(
            f"scale: {n} replicas {throughput:7.1f} calls/s = {throughput / base:.2f}x of 1 "
            f"replica (goal >= {0.9 * n:.1f}x; ideal {n / SLEEP_S:.0f}/s), "
            f"p50 {p50:.1f} ms p99 {p99:.1f} ms"
        )
    return rows


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


CASES = ("overhead", "scale", "failover", "hang", "hostloss")


async def main(args: argparse.Namespace) -> None:
    cases = set(args.cases.split(","))
    if unknown := cases - set(CASES):
        raise SystemExit(f"unknown --cases {sorted(unknown)}; known: {', '.join(CASES)}")
    rows: list[Row] = []
    if "overhead" in cases:
        rows += await bench_overhead(500 if args.quick else 3000)
    if "scale" in cases:
        rows += await bench_scaling([1, 2, 4, 8], 1.0 if args.quick else 3.0)
    if "failover" in cases:
        rows += await bench_failover(2 if args.quick else 5)
    if "hang" in cases:
        rows += await bench_hang(2 if args.quick else 5)
    if "hostloss" in cases:
        rows += await bench_host_loss()
    if args.json:
        with open(args.json, "w") as f:  # noqa: ASYNC230 - once, after measuring
            json.dump([asdict(r) for r in rows], f, indent=1)
        print(f"wrote {len(rows)} rows to {args.json}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls (a smoke run)")
    parser.add_argument("--json", metavar="PATH", help="write the result rows as JSON here")
    parser.add_argument(
        "--cases", default=",".join(CASES), help=f"comma-separated, from {','.join(CASES)}"
    )
    asyncio.run(main(parser.parse_args()))
