"""Bytes and time of one weight sync, whole model against LoRA adapters, in ONE run.

Qwen2.5-0.5B's architecture (`model.arch.QWEN25_05B_ARCH`, random weights built from its
config: nothing downloaded) in two real Monarch processes, as the app runs them:

- a trainer process holds the float32 policy (with `--rank R` adapters on the attention and
  MLP projections, or none) and publishes each version with the app's
  `weight_sync.update.TrainerPublisher`: the whole state dict, or the adapter's tensors;
- a generator process holds the policy in `--dtype` (bfloat16, as the Qwen preset's
  generators), wrapped with the same adapters, and pulls each version with the app's
  `weight_sync.update.pull`, all or nothing, cast to its dtype.

Per version (`--versions` of them after one warm-up version that allocates the staging),
the trainer's trained weights change (a stand-in for an optimizer step, not timed), then the
trainer's publish and the generator's pull are timed; the table shows the medians and the
bytes one version moves (`Manifest.nbytes`, what a step row records as `weight_sync_bytes`).
Each process runs `--threads` torch threads (1, as the app's actors). `--transport rdma`
makes the pull take the cross-machine path (RDMA, or Monarch's TCP
fallback without ibverbs) instead of shared memory.

    uv run python apps/async_grpo/benchmarks/lora_sync.py
    uv run python apps/async_grpo/benchmarks/lora_sync.py --transport rdma --versions 3
    uv run python apps/async_grpo/benchmarks/lora_sync.py --arch tiny    # a quick check
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import time
from typing import TYPE_CHECKING

import torch
from async_grpo.config.presets import ARCHS
from async_grpo.config.schema import LoraConfig
from async_grpo.model.lora import adapter_state, add_adapters
from async_grpo.model.policy import qwen2_config, torch_dtype
from async_grpo.weight_sync.update import TrainerPublisher, WeightUpdate, merge
from async_grpo.weight_sync.update import pull as pull_update
from monarch.actor import Actor, endpoint, this_host
from transformers import PreTrainedModel, Qwen2ForCausalLM

if TYPE_CHECKING:
    from peft import PeftModel


def build(arch: str, rank: int, dtype: torch.dtype) -> tuple[PreTrainedModel, PeftModel | None]:
    """The architecture with random weights in `dtype`, with rank-`rank` adapters (0: none)."""
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(qwen2_config(ARCHS[arch], None))
    model.to(dtype)  # type: ignore[arg-type]
    model.train(False)
    adapter = add_adapters(model, LoraConfig(rank=rank)) if rank else None
    return model, adapter


class BenchTrainer(Actor):
    """The trainer's side: changes its trained weights, then publishes them."""

    def __init__(self, arch: str, rank: int, threads: int) -> None:
        torch.set_num_threads(threads)
        self.model, adapter = build(arch, rank, torch.float32)
        self.trained = [p for p in self.model.parameters() if p.requires_grad]
        self.publisher = TrainerPublisher(self.model, 0, False, adapter)

    @endpoint
    async def publish(self, version: int) -> tuple[WeightUpdate, float]:
        with torch.no_grad():
            for p in self.trained:
                p.add_(1e-3)
        start = time.perf_counter()
        update = merge([self.publisher.publish(version)])
        return update, time.perf_counter() - start


class BenchGenerator(Actor):
    """The generator's side: pulls each version into its own copy."""

    def __init__(self, arch: str, rank: int, dtype: str, threads: int) -> None:
        torch.set_num_threads(threads)
        self.model, wrapped = build(arch, rank, torch_dtype(dtype))
        self.adapter = adapter_state(wrapped) if wrapped is not None else None

    @endpoint
    async def pull(self, update: WeightUpdate) -> float:
        start = time.perf_counter()
        synced = await pull_update(update, self.model, self.adapter)
        if synced.version != update.version:
            raise RuntimeError(f"pulled version {synced.version}, wanted {update.version}")
        return time.perf_counter() - start


@dataclasses.dataclass(frozen=True)
class Row:
    """One sync mode's medians: bytes one version moves, publish and pull seconds."""

    mode: str
    nbytes: int
    publish_s: float
    pull_s: float

    @property
    def sync_s(self) -> float:
        return self.publish_s + self.pull_s


async def measure(args: argparse.Namespace, rank: int) -> Row:
    """Publishes and pulls `args.versions` versions (after a warm-up one) between two fresh
    processes; their medians."""
    trainer_procs = this_host().spawn_procs(per_host={"procs": 1})
    gen_procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        trainer = trainer_procs.spawn("trainer", BenchTrainer, args.arch, rank, args.threads)
        gen = gen_procs.spawn(
            "generator", BenchGenerator, args.arch, rank, args.dtype, args.threads
        )
        publish_s, pull_s, nbytes = [], [], 0
        for version in range(args.versions + 1):
            update, published = await trainer.publish.call_one(version)
            pulled = await gen.pull.call_one(update)
            nbytes = update.nbytes
            if version > 0:  # version 0 allocates the staging and the receive buffers
                publish_s.append(published)
                pull_s.append(pulled)
    finally:
        await trainer_procs.stop()
        await gen_procs.stop()
    mode = f"LoRA rank {rank}" if rank else "whole model"
    each = " ".join(f"{(a + b) * 1e3:.0f}" for a, b in zip(publish_s, pull_s, strict=True))
    print(f"{mode}: sync ms of each version: {each}", flush=True)
    return Row(mode, nbytes, statistics.median(publish_s), statistics.median(pull_s))


def table(rows: list[Row]) -> str:
    full = rows[0]
    lines = [
        "| sync | bytes per version | publish ms | pull ms | sync ms | bytes / whole | "
        "sync time / whole |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.mode} | {r.nbytes:,} | {r.publish_s * 1e3:.1f} | {r.pull_s * 1e3:.1f} | "
            f"{r.sync_s * 1e3:.1f} | {r.nbytes / full.nbytes:.2%} | "
            f"{r.sync_s / full.sync_s:.2%} |"
        )
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="qwen2.5-0.5b", choices=sorted(ARCHS))
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--versions", type=int, default=5)
    parser.add_argument("--transport", default="", choices=["", "rdma"])
    # One, as the app's trainer and generator actors set: with more, each process's idle
    # OpenMP threads spin on the cores the other one needs, which costs the many small
    # copies of an adapter far more than the few large ones of a whole model.
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.transport:
        os.environ["RDMA_TENSOR_TRANSPORT"] = args.transport  # inherited by both processes
    rows = [await measure(args, 0), await measure(args, args.rank)]
    via = args.transport or "shared memory (one machine)"
    print(
        f"{args.arch}, trainer float32, generator {args.dtype}, {via}, median of "
        f"{args.versions} versions:"
    )
    print(table(rows))


if __name__ == "__main__":
    asyncio.run(main())
