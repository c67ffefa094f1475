"""Benchmark: weight sync between two Monarch hosts, through this package and through raw
Monarch `RDMABuffer` reads, in one run.

`monarch.job.ProcessJob({"a": 1, "b": 1})` starts two local hosts. A trainer process runs on
host a; on host b, a *remote* generator declares a machine of its own
(`RDMA_TENSOR_MACHINE_ID=host-b`, see `rdma_tensor.machine`), so every transfer to it takes
the cross-machine path (Monarch `RDMABuffer`: ibverbs where there is a NIC, Monarch's TCP
fallback otherwise), and a *local* generator declares nothing, so it shares the trainer's
machine. The state dict: 64 float32 tensors, 256 MB in all (`--size` changes it).

Methods, each once per round, in turn (so load drift hits them all alike):

    cross_pull          the remote generator's `Subscriber(model)` (mode "auto") pulls a
                        version published just before (untimed): controller -> generator ->
                        RDMA reads of the staging slot -> the model holds the version.
    monarch_rdmabuffer  the same two processes, Monarch used directly: the trainer's 64
                        tensors registered as 64 `RDMABuffer`s once, before timing; the
                        remote generator reads all 64 concurrently into its own tensors.
    cross_sync          publish (the trainer's copy into staging) + the remote pull, i.e.
                        what a trainer -> generator sync costs end to end.
    cross_copy          cross_sync with a copying `Subscriber` (mode "copy", a state dict:
                        what a CUDA or cast destination gets).
    same_host_sync      publish + the local generator's pull (maps the staging slot: shared
                        memory, nothing copied), for comparison.

All are timed from the controller (so each includes its actor messages). Every round's result
is checked bit for bit, and every cross pull must report `Transport.RDMA` and, in mode
"auto", `adopted` (same host: `SHM`, mapped). Seconds are medians of `--repeats` rounds after
two warm-up rounds. The goal, printed
as a ratio of this run: `cross_pull` at >= 0.9x the bandwidth of `monarch_rdmabuffer` (the
package moves the same bytes between the same processes, with its version checks).

Run:
    uv run python packages/rdma-tensor/benchmarks/cross_host.py --threads 1
    uv run python packages/rdma-tensor/benchmarks/cross_host.py --threads 1 --quick --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import torch
from _sync_actors import Generator, Trainer
from monarch.actor import ProcMesh, default_bootstrap_cmd
from monarch.job import ProcessJob
from rdma_tensor import Manifest, PullResult, SyncMode, Transport
from rdma_tensor.machine import machine_env

METHODS = ("cross_pull", "monarch_rdmabuffer", "cross_sync", "cross_copy", "same_host_sync")
GOAL = 0.9  # cross_pull's bandwidth / monarch_rdmabuffer's
WARMUP = 2  # untimed rounds


Series = dict[str, list[float]]


async def bench(total: int, repeats: int, threads: int) -> tuple[Series, Series]:
    job = ProcessJob({"a": 1, "b": 1})
    state = job.state(cached_path=None)
    remote_env = default_bootstrap_cmd().with_env(machine_env("host-b"))
    meshes = [
        state.a.spawn_procs(name="trainer"),
        state.b.spawn_procs(name="remote", bootstrap_command=remote_env),
        state.b.spawn_procs(name="local"),
    ]
    try:
        return await _rounds(meshes, total, repeats, threads)
    finally:
        for procs in meshes:
            await procs.stop()
        job.kill()  # type: ignore[no-untyped-call]  # Monarch's job API is untyped


async def _rounds(
    meshes: list[ProcMesh], total: int, repeats: int, threads: int
) -> tuple[Series, Series]:
    trainer = meshes[0].spawn("trainer", Trainer)
    remote = meshes[1].spawn("remote", Generator)
    local = meshes[2].spawn("local", Generator)
    await asyncio.gather(
        trainer.setup.call_one(total, threads),
        remote.setup.call_one(total, threads),
        local.setup.call_one(total, threads),
    )
    buffers = await trainer.rdma_buffers.call_one()
    version = 0
    detail: Series = {}

    def note(key: str, value: float) -> None:
        detail.setdefault(key, []).append(value)

    async def publish() -> tuple[Manifest, float]:
        nonlocal version
        version += 1
        start = time.perf_counter()
        manifest, stall = await trainer.publish.call_one(version)
        note("publish_stall_s", stall)
        return manifest, time.perf_counter() - start

    async def pull(generator: Generator, manifest: Manifest, mode: SyncMode, key: str) -> float:
        start = time.perf_counter()
        result: PullResult = await generator.pull.call_one(manifest, mode)
        seconds = time.perf_counter() - start
        remote_pull = generator is remote
        want = Transport.RDMA if remote_pull else Transport.SHM
        if result.transport is not want or result.version != version or not result.changed:
            raise AssertionError(f"{key}: expected version {version} over {want}, got {result}")
        # Across hosts mode "auto" adopts the receive buffer (mode "copy" copies); on one it maps.
        shape = (False, mode == "auto") if remote_pull else (True, False)
        if (result.mapped, result.adopted) != shape:
            raise AssertionError(f"{key}: expected (mapped, adopted) {shape}, got {result}")
        note(f"{key}_in_generator_s", result.seconds)
        note(f"{key}_transfer_s", result.copy_seconds)
        return seconds

    async def cross_pull() -> float:
        manifest, _ = await publish()
        return await pull(remote, manifest, "auto", "cross_pull")

    async def raw() -> float:
        start = time.perf_counter()
        await remote.rdma_read.call_one(buffers)
        return time.perf_counter() - start

    def sync(generator: Generator, mode: SyncMode, key: str) -> Callable[[], Awaitable[float]]:
        async def run() -> float:
            manifest, publish_s = await publish()
            return publish_s + await pull(generator, manifest, mode, key)

        return run

    runs: dict[str, tuple[Callable[[], Awaitable[float]], Generator, str]] = {
        # (run, the generator whose destination it fills, which destination: see check)
        "cross_pull": (cross_pull, remote, "model"),
        "monarch_rdmabuffer": (raw, remote, "state"),
        "cross_sync": (sync(remote, "auto", "cross_sync"), remote, "model"),
        "cross_copy": (sync(remote, "copy", "cross_copy"), remote, "state"),
        "same_host_sync": (sync(local, "auto", "same_host_sync"), local, "mapped"),
    }
    times: Series = {m: [] for m in runs}
    # Two warm-up rounds: the first publish allocates staging, and the first two adopting
    # pulls each allocate a receive buffer (the model still runs on the first one).
    for r in range(repeats + WARMUP):
        if r == WARMUP:
            detail.clear()
        for name, (run, generator, where) in runs.items():
            fill = float(r * 10 + METHODS.index(name))
            await trainer.set_version.call_one(fill)
            seconds = await run()
            if not await generator.check.call_one(fill, where):
                raise AssertionError(f"{name}: round {r} left the generator with wrong values")
            if r >= WARMUP:
                times[name].append(seconds)
        print(
            f"  round {r}: "
            + ", ".join(f"{m} {t[-1] * 1e3:.0f} ms" for m, t in times.items() if t),
            flush=True,
        )
    await asyncio.gather(
        trainer.teardown.call_one(), remote.teardown.call_one(), local.teardown.call_one()
    )
    return times, detail


def report(total: int, times: Series, detail: Series) -> dict[str, float]:
    secs = {m: statistics.median(times[m]) for m in METHODS}
    extra = {k: statistics.median(v) for k, v in detail.items()}
    print(f"\n{total / (1 << 20):.0f} MB: {'method':<19} {'seconds':>9} {'GB/s':>7}  (medians)")
    for m in METHODS:
        print(f"{'':>9}{m:<19} {secs[m]:9.4f} {total / secs[m] / 1e9:7.2f}")
    ratio = secs["monarch_rdmabuffer"] / secs["cross_pull"]
    verdict = "met" if ratio >= GOAL else "NOT met"
    print(f"  cross_pull bandwidth / monarch_rdmabuffer's: {ratio:.2f} (goal >= {GOAL}): {verdict}")
    e2e = secs["monarch_rdmabuffer"] / secs["cross_sync"]
    print(f"  cross_sync (publish + pull) bandwidth / monarch_rdmabuffer's: {e2e:.2f}")
    print(f"  same_host_sync / cross_sync time: {secs['same_host_sync'] / secs['cross_sync']:.2f}")
    print(
        f"  where cross_pull's {secs['cross_pull'] * 1e3:.0f} ms go: "
        f"{extra['cross_pull_in_generator_s'] * 1e3:.0f} ms in the generator's pull "
        f"(RDMA reads and applying: {extra['cross_pull_transfer_s'] * 1e3:.0f} ms), the rest "
        f"actor messages; publish (trainer stall): {extra['publish_stall_s'] * 1e3:.0f} ms"
    )
    return {"ratio_pull_vs_raw": ratio, "ratio_sync_vs_raw": e2e, **extra}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds instead of --repeats")
    parser.add_argument("--json", type=Path, help="write the medians and ratios to this file")
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds per method")
    parser.add_argument("--size-mb", type=int, default=256, help="state dict size in MB")
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads per process (0: torch's default)"
    )
    args = parser.parse_args()
    total = args.size_mb << 20
    repeats = 3 if args.quick else args.repeats
    threads = args.threads or torch.get_num_threads()
    print(
        f"machine: {os.cpu_count()} CPUs, torch {torch.__version__}, {threads} torch threads "
        f"per process, load average {os.getloadavg()}",
        flush=True,
    )
    times, detail = await bench(total, repeats, args.threads)
    summary = report(total, times, detail)
    print(f"load average after: {os.getloadavg()}")
    if args.json:
        medians = {m: statistics.median(times[m]) for m in METHODS}
        rows = [
            {"method": m, "bytes": total, "seconds": s, "gbps": total / s / 1e9}
            for m, s in medians.items()
        ]
        out = {"rows": rows, **summary}
        args.json.write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    asyncio.run(main())
