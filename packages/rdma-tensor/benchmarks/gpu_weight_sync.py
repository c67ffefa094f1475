"""Benchmark: a Qwen2.5-0.5B-shaped bf16 state dict from a CUDA trainer process to a CUDA
generator process on one machine, against a device-to-device copy of the same bytes.

The state dict has the names and shapes of `Qwen2ForCausalLM(Qwen2Config(...))` with the
dimensions of Qwen/Qwen2.5-0.5B-Instruct (hidden 896, intermediate 4864, 24 layers, 14 heads,
2 KV heads, vocabulary 151936, tied embeddings; nothing is downloaded), in bfloat16, filled
with seeded random values. Like the async-grpo trainer, the benchmark publishes
`model.state_dict()`, which names the tied embedding twice (`model.embed_tokens.weight` and
`lm_head.weight`): 1.26 GB per version, 0.99 GB of them unique.

Each round (the first warms up and is not counted):

    trainer     refills its CUDA weights (a new version's values), then times one
                device-to-host copy of them into page-locked memory (`d2h_pinned`: the
                least a staging copy can cost);
    sync        `Publisher.publish` in the trainer (`stall`: how long it blocks the trainer;
                it copies into page-locked CPU staging memory), the manifest back to the
                controller and on to the generator, whose `Subscriber(state, mode="copy")`
                copies the version into its CUDA tensors (`pull`) from its mapping of the
                staging memory, page-locked for CUDA where CUDA allows; timed from the
                controller, from the publish until the generator's pull returned;
    d2d         in the generator process, one `copy_` of the same number of bytes from one
                CUDA buffer to another (the ceiling for moving them on the device);
    cuda_ipc    the generator reads the trainer's live CUDA weights through an
                `rdma_tensor.share` handle (CUDA IPC, device to device across processes;
                no staging, no versioning: a comparison, not a weight-sync path).

Every received version is checked bit for bit against the values the generator recomputes
from the round's seed. The ratios printed are within this one run: sync / d2d, pull / d2d,
stall / d2h_pinned.

Without CUDA the same code runs on the CPU with a tiny state dict (`--arch tiny`), as the
rehearsal of `tools/gpu_check.sh` does: its rows are labelled "cpu" and say nothing about a
GPU (d2d is then a host memcpy, and cuda_ipc is skipped).

Run:
    uv run python packages/rdma-tensor/benchmarks/gpu_weight_sync.py
    uv run python packages/rdma-tensor/benchmarks/gpu_weight_sync.py --json out.json
    uv run python packages/rdma-tensor/benchmarks/gpu_weight_sync.py --device cpu --arch tiny
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from _qwen_state import ARCHS, DTYPE, Shapes, fill, flat_views, qwen2_shapes
from monarch.actor import Actor, endpoint, this_host
from rdma_tensor import (
    Manifest,
    Publisher,
    PullResult,
    SharedTensor,
    Subscriber,
    _shm,  # private: only to report whether the pull's source was pinned
    share,
)


def size(nbytes: float) -> str:
    return f"{nbytes / 1e9:.3f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.3f} MB"


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class Trainer(Actor):
    @endpoint
    async def setup(self, shapes: Shapes, device: str, threads: int) -> None:
        if threads:
            torch.set_num_threads(threads)
        self.device = device
        self.flat, self.state = flat_views(shapes, device)
        self.pinned = torch.empty(self.flat.numel(), dtype=DTYPE, pin_memory=device == "cuda")
        self.publisher = Publisher()
        self.shared: SharedTensor | None = share(self.flat) if device == "cuda" else None

    @endpoint
    async def refill(self, seed: int) -> None:
        """The next version's values."""
        fill(self.flat, seed)
        synchronize(self.device)

    @endpoint
    async def d2h_seconds(self) -> float:
        """One copy of the weights into page-locked host memory."""
        start = time.perf_counter()
        self.pinned.copy_(self.flat, non_blocking=True)
        synchronize(self.device)
        return time.perf_counter() - start

    @endpoint
    async def publish(self, version: int) -> tuple[Manifest, float]:
        """The manifest and how long `publish` blocked this process (the trainer's stall)."""
        start = time.perf_counter()
        manifest = self.publisher.publish(self.state, version)
        return manifest, time.perf_counter() - start

    @endpoint
    async def handle(self) -> Any:
        return None if self.shared is None else self.shared.handle

    @endpoint
    async def teardown(self) -> None:
        self.publisher.close()
        if self.shared is not None:
            self.shared.close()


class Generator(Actor):
    @endpoint
    async def setup(self, shapes: Shapes, device: str, threads: int) -> str:
        if threads:
            torch.set_num_threads(threads)
        self.device = device
        self.flat, self.state = flat_views(shapes, device)
        self.flat.zero_()
        self.expected = torch.empty_like(self.flat)
        self.scratch = torch.empty_like(self.flat)
        self.subscriber = Subscriber(self.state, mode="copy")
        return torch.cuda.get_device_name() if device == "cuda" else "cpu"

    @endpoint
    async def pull(self, manifest: Manifest) -> PullResult:
        return await self.subscriber.pull(manifest)

    @endpoint
    async def source_pinned(self) -> bool:
        """Whether the staging memory this process copies from is page-locked for CUDA."""
        return _shm.cuda_registered_bytes() > 0

    @endpoint
    async def check(self) -> bool:
        """Whether the pulled weights are the round's values, bit for bit."""
        return self._check(self.flat)

    @endpoint
    async def expect(self, seed: int) -> None:
        """Recomputes the round's values, which the pulled weights must equal."""
        fill(self.expected, seed)
        synchronize(self.device)

    @endpoint
    async def d2d_seconds(self) -> float:
        """One device-to-device copy of the same bytes (`scratch` <- `expected`)."""
        start = time.perf_counter()
        self.scratch.copy_(self.expected)
        synchronize(self.device)
        return time.perf_counter() - start

    @endpoint
    async def clear_scratch(self) -> None:
        """Zeroes the buffer the CUDA IPC read goes into (it holds the round's values after
        the device-to-device copy, which would pass the check without any read)."""
        self.scratch.zero_()
        synchronize(self.device)

    @endpoint
    async def read_ipc(self, handle: Any) -> tuple[float, str]:
        """Reads the trainer's live weights through their CUDA IPC handle."""
        result = await handle.read_into(self.scratch)
        return result.seconds, result.transport.value

    @endpoint
    async def check_ipc(self) -> bool:
        return self._check(self.scratch)

    def _check(self, got: torch.Tensor) -> bool:
        return bool(torch.equal(got, self.expected))


async def run(device: str, arch: str, repeats: int, threads: int) -> dict[str, Any]:
    shapes, tied, source = qwen2_shapes(ARCHS[arch])
    nbytes = sum(math.prod(s) for _, s in shapes) * DTYPE.itemsize
    tied_bytes = sum(math.prod(s) for n, s in shapes if n in tied) * DTYPE.itemsize
    print(
        f"[{device}] {arch}: {len(shapes)} tensors, {size(nbytes)} in {DTYPE} "
        f"({size(nbytes - tied_bytes)} unique; tied: {', '.join(tied) or 'none'}); "
        f"shapes {source}",
        flush=True,
    )
    procs = this_host().spawn_procs(per_host={"procs": 2})
    trainer = procs.slice(procs=0).spawn("trainer", Trainer)
    generator = procs.slice(procs=1).spawn("generator", Generator)
    _, gpu = await asyncio.gather(
        trainer.setup.call_one(shapes, device, threads),
        generator.setup.call_one(shapes, device, threads),
    )
    handle = await trainer.handle.call_one()
    rounds: list[dict[str, Any]] = []
    for r in range(repeats + 1):  # round 0 warms up: staging is allocated and page-locked
        seed = 1000 + r
        await asyncio.gather(trainer.refill.call_one(seed), generator.expect.call_one(seed))
        # One at a time: copies timed together would share the GPU.
        d2h = await trainer.d2h_seconds.call_one()
        d2d = await generator.d2d_seconds.call_one()
        start = time.perf_counter()
        manifest, stall = await trainer.publish.call_one(r + 1)
        result = await generator.pull.call_one(manifest)
        sync = time.perf_counter() - start
        ok = await generator.check.call_one()
        row: dict[str, Any] = {
            "round": r,
            "sync_s": sync,
            "stall_s": stall,
            "pull_s": result.seconds,
            "pull_copy_s": result.copy_seconds,
            "d2d_s": d2d,
            "d2h_pinned_s": d2h,
            "transport": result.transport.value,
            "bit_for_bit": ok,
        }
        if handle is not None:
            await generator.clear_scratch.call_one()
            start = time.perf_counter()
            ipc_s, transport = await generator.read_ipc.call_one(handle)
            ipc_total = time.perf_counter() - start
            ipc_ok = await generator.check_ipc.call_one()
            row |= {
                "cuda_ipc_s": ipc_total,
                "cuda_ipc_read_s": ipc_s,
                "cuda_ipc_transport": transport,
                "cuda_ipc_bit_for_bit": ipc_ok,
            }
        rounds.append(row)
        print(
            f"  round {r}{' (warm-up)' if r == 0 else ''}: "
            + ", ".join(f"{k[:-2]} {v * 1e3:.1f} ms" for k, v in row.items() if k.endswith("_s"))
            + f", bit for bit: {ok}",
            flush=True,
        )
        if not ok or not row.get("cuda_ipc_bit_for_bit", True):
            raise AssertionError(f"round {r}: the generator's weights differ from version {r + 1}")
    pinned = await generator.source_pinned.call_one()
    await trainer.teardown.call_one()
    await procs.stop()
    timed = rounds[1:]
    keys = [k for k in timed[0] if k.endswith("_s")]
    median = {k[:-2]: statistics.median(row[k] for row in timed) for k in keys}
    summary: dict[str, Any] = {
        "device": device,
        "label": (
            f"{gpu}, bf16 trainer and generator processes on one GPU"
            if device == "cuda"
            else f"CPU rehearsal ({arch} state dict, no CUDA): the numbers say nothing of a GPU"
        ),
        "gpu": gpu,
        "torch": torch.__version__,
        "arch": arch,
        "shapes_from": source,
        "tensors": len(shapes),
        "dtype": str(DTYPE).removeprefix("torch."),
        "bytes": nbytes,
        "unique_bytes": nbytes - tied_bytes,
        "tied": tied,
        "rounds_timed": len(timed),
        "transport": rounds[-1]["transport"],
        "pull_source_pinned": pinned,
        "bit_for_bit": all(r["bit_for_bit"] for r in rounds),
        "median_s": median,
        "gbps": {k: nbytes / v / 1e9 for k, v in median.items() if v > 0},
        "ratios": {
            "sync_over_d2d": median["sync"] / median["d2d"],
            "pull_over_d2d": median["pull"] / median["d2d"],
            "stall_over_d2h_pinned": median["stall"] / median["d2h_pinned"],
        },
        "rounds": rounds,
    }
    if "cuda_ipc" in median:
        summary["ratios"]["cuda_ipc_over_d2d"] = median["cuda_ipc"] / median["d2d"]
    return summary


def report(s: dict[str, Any]) -> None:
    print(f"\n{s['label']}")
    print(f"{size(s['bytes'])} per version, medians of {s['rounds_timed']} rounds:")
    what = {
        "sync": "publish + manifest + the generator's pull (controller-timed)",
        "stall": "publish: the trainer blocked",
        "pull": "the generator's pull (copy mode)",
        "d2d": "one device-to-device copy_ of the same bytes"
        if s["device"] == "cuda"
        else "one host memcpy of the same bytes (no CUDA)",
        "d2h_pinned": "one device-to-host copy into page-locked memory"
        if s["device"] == "cuda"
        else "one host copy (no CUDA)",
        "cuda_ipc": "the generator reading the trainer's live weights by CUDA IPC",
    }
    for key, text in what.items():
        if key in s["median_s"]:
            secs = s["median_s"][key]
            print(f"  {key:<11} {secs * 1e3:9.2f} ms {s['gbps'][key]:8.2f} GB/s  {text}")
    print("  ratios in this run: " + ", ".join(f"{k} {v:.2f}" for k, v in s["ratios"].items()))
    pinned = "page-locked for CUDA" if s["pull_source_pinned"] else "pageable"
    print(f"  the generator copied from staging memory mapped {pinned}")
    if s["device"] != "cuda":
        print("  cuda_ipc: skipped (no CUDA device)")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument(
        "--arch", choices=[*ARCHS, "auto"], default="auto", help="auto: qwen2.5-0.5b on CUDA"
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds")
    parser.add_argument("--quick", action="store_true", help="3 timed rounds")
    parser.add_argument("--threads", type=int, default=0, help="torch threads per process")
    parser.add_argument("--json", type=Path, help="write the summary to this file")
    args = parser.parse_args(argv)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    arch = args.arch if args.arch != "auto" else ("qwen2.5-0.5b" if device == "cuda" else "tiny")
    print(f"machine: {os.cpu_count()} CPUs, torch {torch.__version__}, device {device}", flush=True)
    summary = asyncio.run(run(device, arch, 3 if args.quick else args.repeats, args.threads))
    report(summary)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
