"""Benchmark: trainer -> generator weight sync on one machine, five ways, in one run.

A state dict of 64 float32 tensors (16 MB, 256 MB and 1 GB in total; `--quick`: 256 MB only)
lives in a trainer process; a generator process, on the same machine, holds a state dict of
the same shapes and wants the trainer's values. Methods:

    rdma_tensor         this package's best same-machine CPU path: `publish(v)` in the trainer
                        (one copy into staging), the manifest back to the controller and on
                        to the generator, whose `Subscriber(model)` (mode "auto") maps the
                        new version in place: the model's tensors become views of the
                        staging slot, nothing is copied. Timed from the start of `publish`
                        until the generator's `pull` returned (its model then holds the new
                        weights). Also printed (not in --json): the same with a copying
                        `Subscriber` (mode "copy": what a CUDA or cast destination gets), and
                        the mapping generator already waiting in `pull(min_version=v)` when
                        `publish(v)` starts.
    monarch_rdmabuffer  Monarch `RDMABuffer` used directly: one buffer per tensor, registered
                        once before timing; the generator reads all 64 concurrently.
    actor_message       the generator asks the trainer for its state dict as an actor message
                        and copies it into its tensors.
    gloo_broadcast      `torch.distributed.broadcast` of every tensor over a 2-rank gloo group.
    memcpy              `copy_` of the same bytes inside the generator process: the
                        memory-bandwidth ceiling.

Every timing is the median of `--repeats` rounds after one warm-up round; each round runs
every method once, in turn, so load drift on a shared machine hits all methods alike. The
four transfer methods are timed from the controller (so they include the actor messages
that trigger them). The trainer's stall is how long `publish` blocked it, next to one `copy_`
of its state dict in the same process just before. Every round's result is checked bit for
bit. Each size prints the package's speed goals as ratios of this run, met or not.

Run:
    uv run python packages/rdma-tensor/benchmarks/weight_sync.py --quick
    uv run python packages/rdma-tensor/benchmarks/weight_sync.py --json out.json
    uv run nox -s "bench(package='rdma-tensor')" -- --quick
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import socket
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import torch
from _sync_actors import Generator, Trainer
from monarch.actor import this_host
from rdma_tensor import Manifest, SyncMode

SIZES = {"16MB": 16 << 20, "256MB": 256 << 20, "1GB": 1 << 30}
METHODS = ("rdma_tensor", "monarch_rdmabuffer", "actor_message", "gloo_broadcast", "memcpy")
# Printed next to the rows, not written to --json: (mode, generator already waiting).
EXTRAS: dict[str, tuple[SyncMode, bool]] = {"copy_mode": ("copy", False), "waiting": ("auto", True)}
GOAL_BANDWIDTH, GOAL_SPEEDUP, GOAL_STALL = 0.5, 5.0, 1.5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def bench_size(
    label: str, total: int, repeats: int, threads: int
) -> tuple[list[dict[str, object]], dict[str, float]]:
    """Runs every method once per round, round-robin, so load drift hits them all alike."""
    procs = this_host().spawn_procs(per_host={"procs": 2})
    trainer = procs.slice(procs=0).spawn("trainer", Trainer)
    generator = procs.slice(procs=1).spawn("generator", Generator)
    await asyncio.gather(
        trainer.setup.call_one(total, threads), generator.setup.call_one(total, threads)
    )
    buffers = await trainer.rdma_buffers.call_one()
    port = _free_port()
    await asyncio.gather(trainer.gloo_init.call_one(port), generator.gloo_init.call_one(port))
    version = 0
    latest: Manifest | None = None
    detail: dict[str, list[float]] = {}

    def note(key: str, value: float) -> None:
        detail.setdefault(key, []).append(value)

    async def sync(mode: SyncMode, waiting: bool, key: str) -> float:
        """publish -> manifest -> the generator's Subscriber, timed from the start of publish
        until the generator holds the version. `waiting`: the generator is already in
        `pull(min_version=v)` when publish(v) starts (no manifest message on the way)."""
        nonlocal version, latest
        version += 1
        note("trainer_copy_s", await trainer.copy_seconds.call_one())
        pending = None
        if waiting:
            assert latest is not None
            pending = asyncio.ensure_future(generator.pull.call_one(latest, mode, version))
            await asyncio.sleep(0.05)  # the generator is polling for the next version by now
        start = time.perf_counter()
        latest, stall = await trainer.publish.call_one(version)
        if pending is None:
            pending = asyncio.ensure_future(generator.pull.call_one(latest, mode))
        result = await pending
        elapsed = time.perf_counter() - start
        if result.version != version or result.mapped != (mode == "auto"):
            raise AssertionError(f"{key}: expected version {version} ({mode}), got {result}")
        note(f"{key}_stall_s", stall)
        note(f"{key}_apply_s", result.copy_seconds)
        note(f"{key}_pull_s", result.seconds)
        return elapsed

    async def timed(*calls: Callable[[], Awaitable[object]]) -> float:
        start = time.perf_counter()
        await asyncio.gather(*(c() for c in calls))
        return time.perf_counter() - start

    runs: dict[str, Callable[[], Awaitable[float]]] = {
        "rdma_tensor": lambda: sync("auto", False, "rdma_tensor"),
        "monarch_rdmabuffer": lambda: timed(lambda: generator.rdma_read.call_one(buffers)),
        "actor_message": lambda: timed(lambda: generator.fetch_by_message.call_one(trainer)),
        "gloo_broadcast": lambda: timed(
            trainer.gloo_broadcast.call_one, generator.gloo_broadcast.call_one
        ),
        "memcpy": generator.memcpy_seconds.call_one,
    }
    for key, (mode, waiting) in EXTRAS.items():
        runs[key] = functools.partial(sync, mode, waiting, key)
    times: dict[str, list[float]] = {m: [] for m in runs}
    for r in range(repeats + 1):  # round 0 warms up (first publish allocates staging)
        if r == 1:
            detail.clear()
        for name, run in runs.items():
            fill = float(r * 10 + len(times[name]) % 10)
            await trainer.set_version.call_one(fill)
            seconds = await run()
            mapped = name in ("rdma_tensor", "waiting")
            # memcpy copies the generator's own source, which holds version 0's values.
            expected = 0.0 if name == "memcpy" else fill
            if not await generator.check_and_reset.call_one(expected, mapped):
                raise AssertionError(f"{name}: round {r} left the generator with wrong values")
            if r > 0:
                times[name].append(seconds)
        print(
            f"  {label} round {r}: "
            + ", ".join(f"{m} {t[-1] * 1e3:.0f} ms" for m, t in times.items() if t),
            flush=True,
        )
    await asyncio.gather(trainer.teardown.call_one(), generator.teardown.call_one())
    await procs.stop()
    rows: list[dict[str, object]] = []
    for m in METHODS:
        seconds = statistics.median(times[m])
        rows.append(
            {"method": m, "bytes": total, "seconds": seconds, "gbps": total / seconds / 1e9}
        )
    extra = {k: statistics.median(v) for k, v in detail.items()}
    extra |= {f"{k}_s": statistics.median(times[k]) for k in EXTRAS}
    return rows, extra


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def report(label: str, total: int, rows: list[dict[str, object]], extra: dict[str, float]) -> None:
    by = {str(r["method"]): r for r in rows}
    gbps = {m: float(by[m]["gbps"]) for m in METHODS}  # type: ignore[arg-type]
    secs = {m: float(by[m]["seconds"]) for m in METHODS}  # type: ignore[arg-type]
    print(f"\n{label}: {'method':<19} {'seconds':>10} {'GB/s':>8}")
    for m in METHODS:
        print(f"{'':>{len(label) + 2}}{m:<19} {secs[m]:10.4f} {gbps[m]:8.2f}")
    ours, stall = secs["rdma_tensor"], extra["rdma_tensor_stall_s"]
    ratio = gbps["rdma_tensor"] / gbps["memcpy"]
    speedup = {m: secs[m] / ours for m in METHODS[1:4]}
    stall_ratio = stall / extra["trainer_copy_s"]
    print("  goals (stated for 256 MB), ratios within this run:")
    print(
        f"    end-to-end bandwidth / memcpy's: {ratio:.2f} (goal >= {GOAL_BANDWIDTH}): "
        + _verdict(ratio >= GOAL_BANDWIDTH)
    )
    for m in ("monarch_rdmabuffer", "actor_message"):
        print(
            f"    speed-up vs {m}: {speedup[m]:.1f}x (goal >= {GOAL_SPEEDUP:.0f}x): "
            + _verdict(speedup[m] >= GOAL_SPEEDUP)
        )
    print(
        f"    trainer stall (publish): {stall * 1e3:.1f} ms = {stall_ratio:.2f}x one copy_ of "
        f"the state dict ({extra['trainer_copy_s'] * 1e3:.1f} ms) (goal <= {GOAL_STALL}x): "
        + _verdict(stall_ratio <= GOAL_STALL)
    )
    print(f"    (speed-up vs gloo_broadcast: {speedup['gloo_broadcast']:.1f}x)")
    apply_s, pull_s = extra["rdma_tensor_apply_s"], extra["rdma_tensor_pull_s"]
    rest = ours - stall - pull_s
    print(
        f"  rdma_tensor = publish {stall * 1e3:.1f} ms + the generator's pull "
        f"{pull_s * 1e3:.2f} ms (leasing the version and building its views: "
        f"{apply_s * 1e3:.2f} ms) + actor messages {rest * 1e3:.1f} ms (medians)"
    )
    memcpy = gbps["memcpy"]
    for key, what in (
        ("copy_mode", "a copying Subscriber (mode='copy': CUDA or cast destinations)"),
        ("waiting", "the mapping generator already waiting for the version"),
    ):
        seconds = extra[f"{key}_s"]
        print(
            f"  rdma_tensor with {what}: {seconds * 1e3:.1f} ms = {total / seconds / 1e9:.2f} "
            f"GB/s, {total / seconds / 1e9 / memcpy:.2f} of memcpy's; publish "
            f"{extra[f'{key}_stall_s'] * 1e3:.1f} ms, pull's copy or mapping "
            f"{extra[f'{key}_apply_s'] * 1e3:.2f} ms"
        )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the 256 MB size only")
    parser.add_argument("--json", type=Path, help="write the rows to this file")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per method")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads in the trainer and generator (0: torch's default); 1 steadies "
        "the copies on an oversubscribed machine",
    )
    args = parser.parse_args()
    sizes = {"256MB": SIZES["256MB"]} if args.quick else SIZES
    threads = args.threads or torch.get_num_threads()
    print(
        f"machine: {os.cpu_count()} CPUs, torch {torch.__version__}, {threads} torch threads "
        f"per process, load average {os.getloadavg()}",
        flush=True,
    )
    all_rows: list[dict[str, object]] = []
    for label, total in sizes.items():
        repeats = max(2, args.repeats // 2) if total >= 1 << 30 else args.repeats
        rows, extra = await bench_size(label, total, repeats, args.threads)
        report(label, total, rows, extra)
        all_rows += rows
    print(f"load average after: {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps(all_rows, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    asyncio.run(main())
