"""Throughput and latency of the bubblewrap sandbox on trivial programs.

Run from the repository root (needs bubblewrap):

    uv run python packages/rl-envs/benchmarks/sandbox_throughput.py           # 200 per row
    uv run python packages/rl-envs/benchmarks/sandbox_throughput.py --quick   # 40 per row
    uv run python packages/rl-envs/benchmarks/sandbox_throughput.py --json rows.json
    uv run nox -s "bench(package='rl-envs')" -- --quick

Every program is `print(1)` in a fresh sandbox: start-up (namespaces, mounts, Python) is the
whole cost, which is what bounds a code-execution environment's turns per second. Rows:

- `sandbox, c=1`: one `Sandbox` running programs one after another.
- `sandbox, c=N`: the same with N in flight at once (one process: what one replica does
  with `max_in_flight_per_replica=N`).
- `coder service, c=N`: a one-replica `SandboxedPythonCoder` service called with N in
  flight from this process: a replica end to end, Monarch messaging included.

Latency is per program, from the call to its result; throughput is programs per second of
wall-clock time over the row. The goal is >= 20 programs/s per replica.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass

from actor_service import ServiceConfig, spawn_service
from rl_envs.sandbox import ExecutionResult, Sandbox
from rl_envs.sandbox.service import SandboxedPythonCoder

GOAL = 20.0  # programs per second per replica
PROGRAM = "print(1)\n"


@dataclass(frozen=True)
class Row:
    mode: str
    concurrency: int
    programs: int
    per_second: float
    p50_ms: float
    p99_ms: float


async def measure(
    mode: str, run: Callable[[], Awaitable[ExecutionResult]], n: int, concurrency: int
) -> Row:
    latencies: list[float] = []
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            start = time.perf_counter()
            result = await run()
            latencies.append(time.perf_counter() - start)
            if result.stdout != "1\n":
                raise RuntimeError(f"unexpected result: {result}")

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    wall = time.perf_counter() - start
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]
    return Row(mode, concurrency, n, n / wall, statistics.median(latencies) * 1e3, p99 * 1e3)


async def run_rows(n: int) -> list[Row]:
    sandbox = Sandbox()
    for _ in range(3):  # warm the page cache and the runtime lookup
        await sandbox.arun(PROGRAM)
    rows = []
    for c in (1, 2, 4):
        rows.append(await measure("sandbox", lambda: sandbox.arun(PROGRAM), n, c))
    config = ServiceConfig(replicas=1, max_in_flight_per_replica=4, name="coder")
    async with await spawn_service(SandboxedPythonCoder, config) as coder:
        execute = coder.endpoint(SandboxedPythonCoder.execute)
        await execute.route(PROGRAM)
        for c in (1, 4):
            rows.append(await measure("coder service", lambda: execute.route(PROGRAM), n, c))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="40 programs per row")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    rows = asyncio.run(run_rows(40 if args.quick else 200))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, load average {load:.1f} at the end")
    print(f"{'mode':<15} {'c':>2} {'programs':>8} {'per s':>7} {'p50 ms':>7} {'p99 ms':>7}")
    for r in rows:
        print(
            f"{r.mode:<15} {r.concurrency:>2} {r.programs:>8} {r.per_second:>7.1f} "
            f"{r.p50_ms:>7.1f} {r.p99_ms:>7.1f}"
        )
    best = max(r.per_second for r in rows if r.mode == "coder service")
    verdict = "meets" if best >= GOAL else "MISSES"
    print(f"one coder replica: {best:.1f} programs/s ({verdict} the goal of >= {GOAL:.0f}/s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=1)


if __name__ == "__main__":
    main()
