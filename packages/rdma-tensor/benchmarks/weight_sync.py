"""Benchmark: trainer -> generator weight sync on one machine, five ways, in one run.

A state dict of 64 float32 tensors (16 MB, 256 MB and 1 GB in total; `--quick`: 256 MB only)
lives in a trainer process; a generator process, on the same machine, holds a state dict of
the same shapes and wants the trainer's values. Methods:

    rdma_tensor         `publish(v)` in the trainer (one copy into staging), the manifest
                        back to the controller and on to the generator, `pull` there (auto
                        transport: shared memory), as the async-grpo app does it. Timed from
                        the start of `publish` until the generator's `pull` returned. Also
                        printed (not in --json): the generator already waiting in
                        `pull(previous_manifest, min_version=v)` when `publish(v)` starts, so
                        it copies each bucket as soon as it is staged (pipelined).
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
that trigger them). The trainer's stall is how long `publish` blocked it, next to one `copy_` of its
state dict in the same process just before. Every round's result is checked bit for bit.

Run:
    uv run python packages/rdma-tensor/benchmarks/weight_sync.py --quick
    uv run python packages/rdma-tensor/benchmarks/weight_sync.py --json out.json
    uv run nox -s "bench(package='rdma-tensor')" -- --quick
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import socket
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import torch
import torch.distributed as dist
from monarch.actor import Actor, endpoint, this_host
from monarch.rdma import RDMABuffer
from rdma_tensor import Manifest, Publisher, PullResult, pull

N_TENSORS = 64
SIZES = {"16MB": 16 << 20, "256MB": 256 << 20, "1GB": 1 << 30}
METHODS = ("rdma_tensor", "monarch_rdmabuffer", "actor_message", "gloo_broadcast", "memcpy")


def make_state(total_bytes: int, fill: float) -> dict[str, torch.Tensor]:
    n = total_bytes // N_TENSORS // 4
    return {f"layer{i}.weight": torch.full((n,), fill + i) for i in range(N_TENSORS)}


def holds(state: dict[str, torch.Tensor], fill: float) -> bool:
    return all(bool((t == fill + i).all()) for i, t in enumerate(state.values()))


class Trainer(Actor):
    @endpoint
    async def setup(self, total_bytes: int, threads: int) -> None:
        if threads:
            torch.set_num_threads(threads)
        self.state = make_state(total_bytes, 0.0)
        self.spare = make_state(total_bytes, 0.0)  # target of the reference copy_
        self.publisher = Publisher()
        self.buffers = [RDMABuffer(t.view(torch.uint8)) for t in self.state.values()]

    @endpoint
    async def set_version(self, fill: float) -> None:
        for i, t in enumerate(self.state.values()):
            t.fill_(fill + i)

    @endpoint
    async def publish(self, version: int) -> tuple[Manifest, float]:
        start = time.perf_counter()
        manifest = self.publisher.publish(self.state, version)
        return manifest, time.perf_counter() - start

    @endpoint
    async def copy_seconds(self) -> float:
        """One `copy_` of the state dict in this process (the stall a publish must match)."""
        start = time.perf_counter()
        for dst, src in zip(self.spare.values(), self.state.values(), strict=True):
            dst.copy_(src)
        return time.perf_counter() - start

    @endpoint
    async def rdma_buffers(self) -> list[RDMABuffer]:
        return self.buffers

    @endpoint
    async def state_dict(self) -> dict[str, torch.Tensor]:
        return self.state

    @endpoint
    async def gloo_init(self, port: int) -> None:
        _init_gloo(port, rank=0)

    @endpoint
    async def gloo_broadcast(self) -> None:
        for t in self.state.values():
            dist.broadcast(t, src=0)

    @endpoint
    async def teardown(self) -> None:
        self.publisher.close()
        for buffer in self.buffers:
            await buffer.drop()
        if dist.is_initialized():
            dist.destroy_process_group()
        del self.state, self.spare, self.buffers, self.publisher
        gc.collect()


class Generator(Actor):
    @endpoint
    async def setup(self, total_bytes: int, threads: int) -> None:
        if threads:
            torch.set_num_threads(threads)
        self.state = make_state(total_bytes, -1.0)
        self.source = make_state(total_bytes, 0.0)  # memcpy's source, in this process

    @endpoint
    async def pull(self, manifest: Manifest, min_version: int | None = None) -> PullResult:
        return await pull(manifest, into=self.state, min_version=min_version)

    @endpoint
    async def rdma_read(self, buffers: list[RDMABuffer]) -> None:
        await asyncio.gather(
            *(
                b.read_into(t.view(torch.uint8))
                for b, t in zip(buffers, self.state.values(), strict=True)
            )
        )

    @endpoint
    async def fetch_by_message(self, trainer: Trainer) -> None:
        received = await trainer.state_dict.call_one()
        for dst, src in zip(self.state.values(), received.values(), strict=True):
            dst.copy_(src)

    @endpoint
    async def gloo_init(self, port: int) -> None:
        _init_gloo(port, rank=1)

    @endpoint
    async def gloo_broadcast(self) -> None:
        for t in self.state.values():
            dist.broadcast(t, src=0)

    @endpoint
    async def memcpy_seconds(self) -> float:
        start = time.perf_counter()
        for dst, src in zip(self.state.values(), self.source.values(), strict=True):
            dst.copy_(src)
        return time.perf_counter() - start

    @endpoint
    async def check_and_reset(self, fill: float) -> bool:
        ok = holds(self.state, fill)
        for t in self.state.values():
            t.fill_(-1.0)
        return ok

    @endpoint
    async def teardown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        del self.state, self.source
        gc.collect()


def _init_gloo(port: int, rank: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)


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
    detail: dict[str, list[float]] = {
        "stall_s": [],
        "trainer_copy_s": [],
        "pull_copy_s": [],
        "waiting_s": [],
        "waiting_stall_s": [],
        "pipelined": [],
    }
    latest: Manifest | None = None

    async def publish(stalls: str) -> tuple[Manifest, float]:
        nonlocal version
        version += 1
        detail["trainer_copy_s"].append(await trainer.copy_seconds.call_one())
        start = time.perf_counter()
        manifest, stall = await trainer.publish.call_one(version)
        detail[stalls].append(stall)
        return manifest, start

    async def rdma_tensor() -> float:
        """The trainer publishes and returns the manifest, which goes to the generator."""
        nonlocal latest
        latest, start = await publish("stall_s")
        result = await generator.pull.call_one(latest)
        elapsed = time.perf_counter() - start
        detail["pull_copy_s"].append(result.copy_seconds)
        return elapsed

    async def rdma_tensor_waiting() -> float:
        """The generator already waits for the next version when the trainer publishes it."""
        nonlocal latest
        assert latest is not None
        waiting = asyncio.ensure_future(generator.pull.call_one(latest, version + 1))
        await asyncio.sleep(0.05)  # the generator is polling for the next version by now
        latest, start = await publish("waiting_stall_s")
        result = await waiting
        detail["pipelined"].append(float(result.pipelined))
        return time.perf_counter() - start

    async def timed(*calls: Callable[[], Awaitable[object]]) -> float:
        start = time.perf_counter()
        await asyncio.gather(*(c() for c in calls))
        return time.perf_counter() - start

    runs: dict[str, Callable[[], Awaitable[float]]] = {
        "rdma_tensor": rdma_tensor,
        "monarch_rdmabuffer": lambda: timed(lambda: generator.rdma_read.call_one(buffers)),
        "actor_message": lambda: timed(lambda: generator.fetch_by_message.call_one(trainer)),
        "gloo_broadcast": lambda: timed(
            trainer.gloo_broadcast.call_one, generator.gloo_broadcast.call_one
        ),
        "memcpy": generator.memcpy_seconds.call_one,
    }
    times: dict[str, list[float]] = {m: [] for m in METHODS}
    for r in range(repeats + 1):  # round 0 warms up (first publish allocates staging)
        if r == 1:
            for values in detail.values():
                values.clear()
        for name, run in runs.items():
            fill = float(r * 10 + 1)
            await trainer.set_version.call_one(fill)
            seconds = await run()
            # memcpy copies the generator's own source, which holds version 0's values.
            if not await generator.check_and_reset.call_one(0.0 if name == "memcpy" else fill):
                raise AssertionError(f"{name}: round {r} left the generator with wrong values")
            if r > 0:
                times[name].append(seconds)
        fill = float(r * 10 + 5)  # after `rdma_tensor`, so there is a version to wait on
        await trainer.set_version.call_one(fill)
        seconds = await rdma_tensor_waiting()
        if not await generator.check_and_reset.call_one(fill):
            raise AssertionError(f"rdma_tensor (waiting generator): round {r} wrong values")
        detail["waiting_s"].append(seconds)
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
    return rows, extra


def report(label: str, total: int, rows: list[dict[str, object]], extra: dict[str, float]) -> None:
    by = {str(r["method"]): r for r in rows}
    gbps = {m: float(by[m]["gbps"]) for m in METHODS}  # type: ignore[arg-type]
    secs = {m: float(by[m]["seconds"]) for m in METHODS}  # type: ignore[arg-type]
    print(f"\n{label}: {'method':<19} {'seconds':>10} {'GB/s':>8}")
    for m in METHODS:
        print(f"{'':>{len(label) + 2}}{m:<19} {secs[m]:10.4f} {gbps[m]:8.2f}")
    ours = secs["rdma_tensor"]
    stall_ratio = extra["stall_s"] / extra["trainer_copy_s"]
    speedups = ", ".join(
        f"vs {m}: {secs[m] / ours:.1f}x"
        for m in ("monarch_rdmabuffer", "actor_message", "gloo_broadcast")
    )
    ratio = gbps["rdma_tensor"] / gbps["memcpy"]
    print(f"  end-to-end vs memcpy bandwidth: {ratio:.2f} (goal >= 0.5)")
    print(f"  speed-up {speedups} (goal >= 5x)")
    print(
        f"  trainer stall (publish): {extra['stall_s'] * 1e3:.1f} ms = {stall_ratio:.2f}x one "
        f"copy_ of the state dict ({extra['trainer_copy_s'] * 1e3:.1f} ms) (goal <= 1.5x)"
    )
    rest = ours - extra["stall_s"] - extra["pull_copy_s"]
    print(
        f"  rdma_tensor: publish {extra['stall_s'] * 1e3:.1f} ms + pull's copy "
        f"{extra['pull_copy_s'] * 1e3:.1f} ms + actor messages {rest * 1e3:.1f} ms (medians)"
    )
    waiting = extra["waiting_s"]
    print(
        f"  rdma_tensor with the generator already waiting (pipelined in "
        f"{extra['pipelined']:.0%} of the rounds): {waiting * 1e3:.1f} ms = "
        f"{total / waiting / 1e9:.2f} GB/s, {total / waiting / 1e9 / gbps['memcpy']:.2f} of "
        f"memcpy's bandwidth; trainer stall {extra['waiting_stall_s'] * 1e3:.1f} ms"
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
