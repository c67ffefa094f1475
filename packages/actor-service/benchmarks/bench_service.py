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
import json
import statistics
import time
from dataclasses import asdict

from _common import PHASE_SLACK_S, Bench, Row, deadline, quantiles
from _fault_cases import bench_failover, bench_hang, bench_host_loss
from actor_service import Service, ServiceConfig, spawn_service

SLEEP_S = 0.05


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
