"""The two generation engines in ONE run: sampling throughput and in-place weight updates.

For each model (the tiny preset's architecture in float32; Qwen2.5-0.5B's architecture with
random weights in bfloat16) and each engine (`hf`, `vllm`), in a fresh process each:

- tokens_per_s: generated tokens per second, `--prompts` prompts x `--group` samples of up
  to `--new-tokens` tokens (temperature 1, EOS stops a sample, as the app samples), the
  best of `--repeats` timed calls after one warm-up call;
- update_s: one weight update as the app does it: the trainer's float32 state dict is
  published with `rdma_tensor.Publisher` (not timed), then `engine.load_weights(manifest)`
  pulls it and installs it, median of `--repeats` versions;
- memcpy_s: one copy of the same weights into tensors of the engine's dtype (the least
  any in-place update moves), median of `--repeats`;
- reload_s: vllm only, the part of `update_s` spent in vLLM's `reload_weights` (the rest is
  the pull: the staging memory is mapped, not copied, on the trainer's machine).

It also prints how far each engine's recorded behavior log-probs are from the trainer's
float32 recomputation at equal weights, with the engine in float32 and in bfloat16.

Every process uses `--threads` torch threads (default: all cores).

    uv sync --extra vllm
    uv run --extra vllm python apps/async_grpo/benchmarks/engines.py --json engines.json
    uv run --extra vllm python apps/async_grpo/benchmarks/engines.py --quick

`--json PATH` writes rows {"engine", "model", "tokens_per_s", "update_s", "memcpy_s",
"reload_s"}. Without vLLM installed only the hf rows are measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Literal

import torch
from async_grpo.actors.cores import usable_cpus

MODELS: dict[str, Literal["float32", "bfloat16"]] = {
    "tiny": "float32",
    "qwen2.5-0.5b": "bfloat16",
}


def measure(engine_name: str, arch: str, args: argparse.Namespace) -> dict[str, object]:
    """One engine on one model, in this process."""
    from async_grpo.config.presets import ARCHS  # noqa: PLC0415
    from async_grpo.config.schema import ModelConfig, SamplingConfig  # noqa: PLC0415
    from async_grpo.generation.engines import make_engine  # noqa: PLC0415
    from async_grpo.model.policy import load_policy, write_random_checkpoint  # noqa: PLC0415
    from async_grpo.tasks.prompts import corpus_for  # noqa: PLC0415
    from rdma_tensor import Publisher  # noqa: PLC0415

    torch.set_num_threads(args.threads)
    dtype = MODELS[arch]
    with tempfile.TemporaryDirectory() as tmp:
        path = write_random_checkpoint(Path(tmp), ARCHS[arch], corpus_for("count", 1, 6), seed=0)
        sampling = SamplingConfig(group_size=args.group, max_new_tokens=args.new_tokens)
        engine = make_engine(
            engine_name, str(path), ModelConfig(dtype=dtype), sampling, 0, kv_cache_gib=1.0
        )
        prompts = [f"count to {1 + i % 6} :" for i in range(args.prompts)]
        engine.generate(prompts)  # warm-up
        rates = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            groups = engine.generate(prompts)
            seconds = time.perf_counter() - start
            rates.append(sum(len(c.response_ids) for g in groups for c in g) / seconds)
        trainer_state = load_policy(str(path)).state_dict()  # what the trainer publishes
    publisher = Publisher()
    updates, reloads, copies = [], [], []
    target = getattr(torch, dtype)
    copy_into = {n: torch.empty(t.shape, dtype=target) for n, t in trainer_state.items()}
    for version in range(1, args.repeats + 1):
        state = {n: t + 0.01 * version for n, t in trainer_state.items()}
        manifest = publisher.publish(state, version)
        start = time.perf_counter()
        sync = asyncio.run(engine.load_weights(manifest))
        updates.append(time.perf_counter() - start)
        assert sync.version == version, sync
        reloads.append(float(getattr(engine, "last_reload_s", float("nan"))))
        start = time.perf_counter()
        for name, t in state.items():
            copy_into[name].copy_(t)
        copies.append(time.perf_counter() - start)
    publisher.close()
    engine.close()
    return {
        "engine": engine_name,
        "model": arch,
        "tokens_per_s": max(rates),
        "update_s": statistics.median(updates),
        "memcpy_s": statistics.median(copies),
        "reload_s": statistics.median(reloads) if engine_name == "vllm" else None,
    }


def logprob_gap(engine_name: str, dtype: Literal["float32", "bfloat16"]) -> float:
    """Max |behavior log-prob - the trainer's float32 recomputation| over every sampled token
    of 64 samples from the tiny model at equal weights (temperature 0.7, top-p 0.9)."""
    import itertools  # noqa: PLC0415

    from async_grpo.config.presets import ARCHS  # noqa: PLC0415
    from async_grpo.config.schema import ModelConfig, SamplingConfig  # noqa: PLC0415
    from async_grpo.generation.engines import make_engine  # noqa: PLC0415
    from async_grpo.generation.episodes import to_episodes  # noqa: PLC0415
    from async_grpo.grpo.batching import pack, sequence_logprobs  # noqa: PLC0415
    from async_grpo.model.policy import load_policy, load_tokenizer, write_random_checkpoint  # noqa: PLC0415
    from async_grpo.tasks.prompts import corpus_for  # noqa: PLC0415

    sampling = SamplingConfig(group_size=8, max_new_tokens=8, temperature=0.7, top_p=0.9)
    with tempfile.TemporaryDirectory() as tmp:
        path = write_random_checkpoint(Path(tmp), ARCHS["tiny"], corpus_for("count", 1, 6), seed=0)
        engine = make_engine(
            engine_name, str(path), ModelConfig(dtype=dtype), sampling, 0, kv_cache_gib=0.25
        )
        groups = engine.generate([f"count to {1 + i % 6} :" for i in range(8)])
        engine.close()
        trainer = load_policy(str(path))
        vocab = len(load_tokenizer(str(path)))
    batch = pack(to_episodes(groups, [0.0] * 64, itertools.count()), pad_id=0)
    with torch.no_grad():
        lp = sequence_logprobs(trainer, batch, sampling.temperature, sampling.top_p, vocab)
    mask = batch.response_mask.bool()
    return float((lp - batch.behavior_logprobs)[mask].abs().max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=usable_cpus())
    parser.add_argument("--quick", action="store_true", help="the tiny model only")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--one", nargs=2, metavar=("ENGINE", "MODEL"), help=argparse.SUPPRESS)
    parser.add_argument("--gap", nargs=2, metavar=("ENGINE", "DTYPE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one[0], args.one[1], args)))
        return
    if args.gap:
        print(json.dumps(logprob_gap(args.gap[0], args.gap[1])))
        return
    from async_grpo.generation.engines.vllm_engine import installed  # noqa: PLC0415

    engines = ["hf", "vllm"] if installed() else ["hf"]
    if not installed():
        print("vLLM is not installed (uv sync --extra vllm): measuring the hf engine only")
    models = ["tiny"] if args.quick else list(MODELS)
    print(
        f"{args.prompts} prompts x {args.group} samples x <= {args.new_tokens} new tokens, "
        f"{args.threads} threads, {usable_cpus()} CPUs"
    )
    passed = [f"--prompts={args.prompts}", f"--group={args.group}", f"--repeats={args.repeats}"]
    passed += [f"--new-tokens={args.new_tokens}", f"--threads={args.threads}"]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}  # vLLM keeps torch at 1 else
    rows = []
    for model in models:
        for engine in engines:
            cmd = [sys.executable, __file__, *passed, "--one", engine, model]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{'model':13} {'engine':6} {'tokens/s':>9}", end=" ")
    print(f"{'update s':>9} {'memcpy s':>9} {'reload s':>9}")
    for r in rows:
        reload_s = f"{r['reload_s']:9.3f}" if r["reload_s"] is not None else f"{'-':>9}"
        print(
            f"{r['model']:13} {r['engine']:6} {r['tokens_per_s']:9.1f} {r['update_s']:9.3f} "
            f"{r['memcpy_s']:9.3f} {reload_s}"
        )
    print("behavior log-probs vs the trainer's float32 recomputation, tiny model, max |diff|:")
    for engine in engines:
        gaps = []
        for dtype in ("float32", "bfloat16"):
            cmd = [sys.executable, __file__, "--gap", engine, dtype]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
            gaps.append(f"{dtype} {float(out.stdout.strip().splitlines()[-1]):.2e}")
        print(f"  {engine:6} " + ", ".join(gaps))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
