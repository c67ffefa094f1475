"""Benchmarks of actor-service: routing overhead, scaling with replicas, failover time.

    uv run python packages/actor-service/benchmarks/bench_service.py [--quick] [--json PATH]
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

Ratios are measured within one run; on a shared machine absolute numbers move with load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from actor_service import RoundRobin, Service, ServiceConfig, spawn_service
from monarch.actor import Actor, endpoint

SLEEP_S = 0.05


class Bench(Actor):
    @endpoint
    async def noop(self) -> None:
        return None

    @endpoint
    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


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


async def until(condition: Callable[[], bool]) -> None:
    """Polls every 2 ms: `status()` is a snapshot, there is no event to wait on."""
    while not condition():  # noqa: ASYNC110
        await asyncio.sleep(0.002)


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
            await until(lambda: svc.status().replicas[1].state != "healthy")
            detect.append((time.perf_counter() - t0) * 1e3)
            await until(lambda: svc.status().replicas[1].state == "healthy")
            recover.append((time.perf_counter() - t0) * 1e3)
        stop.set()
        await asyncio.gather(*callers)
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


async def main(args: argparse.Namespace) -> None:
    rows = await bench_overhead(500 if args.quick else 3000)
    rows += await bench_scaling([1, 2, 4, 8], 1.0 if args.quick else 3.0)
    rows += await bench_failover(2 if args.quick else 5)
    if args.json:
        with open(args.json, "w") as f:  # noqa: ASYNC230 - once, after measuring
            json.dump([asdict(r) for r in rows], f, indent=1)
        print(f"wrote {len(rows)} rows to {args.json}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls (a smoke run)")
    parser.add_argument("--json", metavar="PATH", help="write the result rows as JSON here")
    asyncio.run(main(parser.parse_args()))
