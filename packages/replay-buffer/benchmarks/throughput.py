"""Add+sample throughput of replay-buffer, in one process and through `ReplayBufferActor`.

Run from the repository root:

    uv run python packages/replay-buffer/benchmarks/throughput.py          # 1e3, 1e4, 1e5
    uv run python packages/replay-buffer/benchmarks/throughput.py --quick  # 1e3, one run
    uv run python packages/replay-buffer/benchmarks/throughput.py --json rows.json
    uv run nox -s "bench(package='replay-buffer')" -- --quick              # the same, via nox

What one measurement does, for `n` episodes: fill a buffer with `n` episodes (untimed), then
time `n` more flowing through it in steps of `add_many(64)` + `sample(version, 64)`, so the
buffer holds `n` episodes the whole time (its indices are as large as they get). The config
keeps staleness and capacity bookkeeping on (`max_policy_age=4`, `max_buffer_size=2n`) and
samples use-once. Throughput is `n / seconds`: episodes that went in and came out again.

In-process rows give wall-clock and CPU-time throughput, best of 3 runs. On a shared machine
other processes steal the core, which inflates wall-clock time but not this process's CPU
time, so CPU time is the steadier measure of the code's own cost (on an idle core the two
agree); the goal check uses it. Python's garbage collector stays on, as in real use.

Actor rows run once, with the buffer in its own Monarch process and each `add_many` and
`sample` a message round trip made from this process, one after another as a trainer loop
would; only wall-clock time means anything there.

Episodes have a 16-token prompt and a 32-token response. Building them (with validation) is
timed too, as the "construct" row: producers pay that cost, not the buffer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from dataclasses import asdict, dataclass

import torch
from monarch.actor import this_host
from replay_buffer import (
    Episode,
    ReplayBuffer,
    ReplayBufferActor,
    ReplayBufferConfig,
    SamplingName,
)

BATCH = 64
GOAL = 100_000  # episodes/s, add+sample in one process
PROMPT, RESPONSE = 16, 32
POLICIES: tuple[SamplingName, ...] = ("fifo", "uniform", "prioritized")


@dataclass(frozen=True)
class Row:
    mode: str  # "construct", "in_process" or "actor"
    sampling: str
    episodes: int
    wall_s: float
    cpu_s: float | None  # this process's CPU time; None where other processes do the work

    @property
    def per_wall_s(self) -> float:
        return self.episodes / self.wall_s

    @property
    def per_cpu_s(self) -> float | None:
        return None if self.cpu_s is None else self.episodes / self.cpu_s


def build_episodes(n: int) -> list[Episode]:
    prompt = torch.arange(PROMPT, dtype=torch.long)
    response = torch.arange(RESPONSE, dtype=torch.long)
    return [
        Episode(
            prompt_ids=prompt,
            response_ids=response,
            behavior_logprobs=torch.full((RESPONSE,), -0.7),
            reward=float(i % 2),
            advantage=(i % 7 - 3) / 3.0,
            policy_version=0,
        )
        for i in range(n)
    ]


def config_for(n: int, sampling: SamplingName) -> ReplayBufferConfig:
    return ReplayBufferConfig(sampling=sampling, max_policy_age=4, max_buffer_size=2 * n)


def chunks(pool: list[Episode], n: int) -> list[list[Episode]]:
    return [pool[start : start + BATCH] for start in range(0, n, BATCH)]


def in_process(pool: list[Episode], n: int, sampling: SamplingName, repeats: int) -> Row:
    steps = chunks(pool, n)
    runs = []
    for _ in range(repeats):
        buffer = ReplayBuffer(config_for(n, sampling))
        buffer.add_many(pool[:n])
        wall, cpu = time.perf_counter(), time.process_time()
        for step in steps:
            buffer.add_many(step)
            if buffer.sample(0, len(step)) is None:
                raise RuntimeError("the benchmark buffer ran dry")
        runs.append((time.process_time() - cpu, time.perf_counter() - wall))
    best_cpu = min(cpu for cpu, _ in runs)
    best_wall = min(wall for _, wall in runs)
    return Row("in_process", sampling, n, best_wall, best_cpu)


async def through_actor(pool: list[Episode], sizes: list[int]) -> list[Row]:
    rows = []
    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        for n in sizes:
            buffer = procs.spawn(f"buffer_{n}", ReplayBufferActor, config_for(n, "fifo"))
            for first in range(0, n, 1024):
                await buffer.add_many.call_one(pool[first : min(n, first + 1024)])
            start = time.perf_counter()
            for step in chunks(pool, n):
                await buffer.add_many.call_one(step)
                if await buffer.sample.call_one(0, len(step)) is None:
                    raise RuntimeError("the benchmark buffer ran dry")
            rows.append(Row("actor", "fifo", n, time.perf_counter() - start, None))
            await buffer.stop()
    finally:
        await procs.stop()
    return rows


def report(rows: list[Row]) -> None:
    print(f"\n{'mode':<11} {'sampling':<12} {'episodes':>9} {'episodes/s':>11} {'per CPU s':>11}")
    for row in rows:
        per_cpu = "-" if row.per_cpu_s is None else f"{row.per_cpu_s:,.0f}"
        print(
            f"{row.mode:<11} {row.sampling:<12} {row.episodes:>9} "
            f"{row.per_wall_s:>11,.0f} {per_cpu:>11}"
        )
    print(f"\nin-process add+sample (per CPU second) against the goal of {GOAL:,} episodes/s:")
    for row in rows:
        if row.mode == "in_process" and row.per_cpu_s is not None:
            verdict = "met" if row.per_cpu_s >= GOAL else "NOT met"
            print(
                f"  {row.sampling:<12} n={row.episodes:<7} "
                f"{row.per_cpu_s / GOAL:5.2f}x the goal ({verdict})"
            )
    for row in rows:
        if row.mode == "actor":
            key = ("in_process", "fifo", row.episodes)
            local = next(r for r in rows if (r.mode, r.sampling, r.episodes) == key)
            print(
                f"through the actor, n={row.episodes}: {row.per_wall_s:,.0f} episodes/s, "
                f"{local.per_wall_s / row.per_wall_s:.0f}x below in-process (wall clock)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1e3 episodes only, one run each")
    parser.add_argument("--json", metavar="PATH", help="also write the rows to PATH as JSON")
    args = parser.parse_args()
    sizes = [1_000] if args.quick else [1_000, 10_000, 100_000]
    repeats = 1 if args.quick else 3

    print(
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"torch {torch.__version__}; load average at start {os.getloadavg()[0]:.2f}"
    )
    wall, cpu = time.perf_counter(), time.process_time()
    pool = build_episodes(2 * max(sizes))
    rows = [Row("construct", "-", len(pool), time.perf_counter() - wall, time.process_time() - cpu)]
    rows += [in_process(pool, n, sampling, repeats) for sampling in POLICIES for n in sizes]
    rows += asyncio.run(through_actor(pool, sizes))
    report(rows)
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(
                [
                    {**asdict(row), "episodes_per_s": row.per_wall_s, "per_cpu_s": row.per_cpu_s}
                    for row in rows
                ],
                file,
                indent=1,
            )


if __name__ == "__main__":
    main()
