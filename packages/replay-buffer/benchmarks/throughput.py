"""Add+sample throughput of replay-buffer, in one process and through `ReplayBufferActor`.

Run from the repository root:

    uv run python packages/replay-buffer/benchmarks/throughput.py          # 1e3, 1e4, 1e5
    uv run python packages/replay-buffer/benchmarks/throughput.py --quick  # 1e3 only
    uv run python packages/replay-buffer/benchmarks/throughput.py --json rows.json
    uv run nox -s "bench(package='replay-buffer')" -- --quick              # the same, via nox

What one measurement does, for `n` episodes: fill a buffer with `n` episodes (untimed), then
time `n` more flowing through it in steps of `add_many(64)` + `sample(version, 64)`, so the
buffer holds `n` episodes the whole time (its indices are as large as they get). Every
config keeps staleness and capacity bookkeeping on (`max_policy_age=4`,
`max_buffer_size=2n`), use-once sampling. Throughput is `n / seconds`: episodes that went in
and came out again. In-process rows take the best of 3 runs (the machine is shared and
noisy); actor rows run once, with the buffer in its own Monarch process and the calls made
one after another from this process, as a trainer loop would.

Episodes have a 16-token prompt and a 32-token response. Building them (with validation) is
timed too, as the "construct" row: generators pay that cost, not the buffer.
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


@dataclass(frozen=True)
class Row:
    mode: str  # "construct", "in_process" or "actor"
    sampling: str
    episodes: int
    seconds: float
    episodes_per_s: float


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
    return ReplayBufferConfig(
        sampling=sampling,
        max_policy_age=4,
        max_buffer_size=2 * n,
    )


def chunks(pool: list[Episode], n: int) -> list[list[Episode]]:
    return [pool[start : start + BATCH] for start in range(0, n, BATCH)]


def in_process(pool: list[Episode], n: int, sampling: SamplingName, repeats: int) -> float:
    best = float("inf")
    steps = chunks(pool, n)
    for _ in range(repeats):
        buffer = ReplayBuffer(config_for(n, sampling))
        buffer.add_many(pool[:n])
        start = time.perf_counter()
        for step in steps:
            buffer.add_many(step)
            if buffer.sample(0, len(step)) is None:
                raise RuntimeError("the benchmark buffer ran dry")
        best = min(best, time.perf_counter() - start)
    return best


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
            seconds = time.perf_counter() - start
            rows.append(Row("actor", "fifo", n, seconds, n / seconds))
            await buffer.stop()
    finally:
        await procs.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1e3 episodes only, one run each")
    parser.add_argument("--json", metavar="PATH", help="also write the rows to PATH as JSON")
    args = parser.parse_args()
    sizes = [1_000] if args.quick else [1_000, 10_000, 100_000]
    repeats = 1 if args.quick else 3

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, torch {torch.__version__}; "
        f"load average at start {os.getloadavg()[0]:.2f}"
    )
    start = time.perf_counter()
    pool = build_episodes(2 * max(sizes))
    seconds = time.perf_counter() - start
    rows = [Row("construct", "-", len(pool), seconds, len(pool) / seconds)]
    policies: tuple[SamplingName, ...] = ("fifo", "uniform", "prioritized")
    for sampling in policies:
        for n in sizes:
            seconds = in_process(pool, n, sampling, repeats)
            rows.append(Row("in_process", sampling, n, seconds, n / seconds))
    rows += asyncio.run(through_actor(pool, sizes))

    print(f"\n{'mode':<11} {'sampling':<12} {'episodes':>9} {'seconds':>9} {'episodes/s':>12}")
    for row in rows:
        print(
            f"{row.mode:<11} {row.sampling:<12} {row.episodes:>9} {row.seconds:>9.3f} "
            f"{row.episodes_per_s:>12,.0f}"
        )
    print(f"\nload average at end {os.getloadavg()[0]:.2f}")
    print(f"in-process add+sample against the goal of {GOAL:,} episodes/s:")
    for row in rows:
        if row.mode == "in_process":
            verdict = "met" if row.episodes_per_s >= GOAL else "NOT met"
            print(
                f"  {row.sampling:<12} n={row.episodes:<7} "
                f"{row.episodes_per_s / GOAL:5.2f}x goal ({verdict})"
            )
    for row in rows:
        if row.mode == "actor":
            key = ("in_process", "fifo", row.episodes)
            local = next(r for r in rows if (r.mode, r.sampling, r.episodes) == key)
            print(
                f"actor n={row.episodes}: {local.episodes_per_s / row.episodes_per_s:.0f}x slower "
                "than in-process (pickling episodes + one message round trip per call)"
            )
    if args.json:
        with open(args.json, "w") as file:
            json.dump([asdict(row) for row in rows], file, indent=1)


if __name__ == "__main__":
    main()
