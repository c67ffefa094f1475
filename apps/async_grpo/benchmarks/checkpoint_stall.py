"""How long a checkpoint holds the trainer, against one optimizer step.

    uv run python apps/async_grpo/benchmarks/checkpoint_stall.py --json stall.json
    uv run python apps/async_grpo/benchmarks/checkpoint_stall.py --arch qwen2.5-0.5b   # GPU

One process, no Monarch: the trainer's own code (`training.TrainerCore` on a random
Qwen2-architecture model, on CUDA when there is one) trains on a fixed batch of synthetic
episodes and writes its checkpoint every `--every` steps with `trainer_state.CheckpointWriter`,
exactly as a trainer rank does (`Trainer.save`): the copy to CPU runs in the background and
only the next optimizer update waits for it. Measured in one run: the median step with no
checkpoint going on, the hold (what `save` costs the trainer before it trains on), one
background copy and write timed alone, and the median step while a checkpoint is being
copied or written (the first such step includes the wait for the copy). Each write is let
finish before the next checkpoint, untimed, as in a run that checkpoints every 100 steps.
Prints the ratios hold / step and (step while writing) / step; `--json` writes them.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from async_grpo.checkpoint.trainer_state import CheckpointWriter
from async_grpo.config.presets import ARCHS
from async_grpo.config.schema import LossConfig, SamplingConfig, TrainerConfig
from async_grpo.grpo.step import TrainerCore
from async_grpo.model.policy import qwen2_config
from async_grpo.model.tokenizer import build_tokenizer
from async_grpo.tasks.prompts import corpus_for
from replay_buffer import Episode
from transformers import Qwen2ForCausalLM


@dataclasses.dataclass(frozen=True)
class Result:
    """Seconds: the median step without a write, the mean hold per checkpoint, one
    background write timed alone, the median step while a write ran; their ratios; the
    checkpoint's size in bytes and where it ran."""

    arch: str
    device: str
    batch: int
    step_s: float
    hold_s: float
    write_s: float
    step_while_writing_s: float
    hold_over_step: float
    writing_over_step: float
    checkpoint_bytes: int
    checkpoints: int


def episodes(batch: int, group: int, vocab: int, length: int) -> list[Episode]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for i in range(batch):
        response = torch.randint(0, vocab, (length,), generator=gen)
        out.append(
            Episode(
                prompt_ids=torch.randint(0, vocab, (length,), generator=gen),
                response_ids=response,
                behavior_logprobs=torch.full((length,), -2.0),
                reward=float(i % 2),
                advantage=float(i % 2) - 0.5,
                policy_version=0,
                group_id=i // group,
            )
        )
    return out


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", choices=sorted(ARCHS), default="tiny")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=32, help="prompt and response tokens")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = build_tokenizer(corpus_for("count", 1, 6))
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(qwen2_config(ARCHS[args.arch], tokenizer))
    model.to(device)  # type: ignore[arg-type]
    model.train(True)
    group = 8
    cfg = TrainerConfig(lr=1e-6, batch_size=args.batch, loss=LossConfig())
    vocab = int(model.config.vocab_size)
    core = TrainerCore(
        model, cfg, SamplingConfig(group_size=group), vocab_size=vocab, pad_id=0, total_steps=1000
    )
    batch = episodes(args.batch, group, vocab, args.length)
    writer = CheckpointWriter(sharded=False)
    quiet: list[float] = []
    busy: list[float] = []
    holds: list[float] = []
    writes: list[float] = []
    size = 0
    with tempfile.TemporaryDirectory() as root:
        for step in range(1, args.steps + 1):
            writing = writer.writing
            begin = time.perf_counter()
            core.step(batch, None)  # waits for a checkpoint's copy before its update
            sync()
            (busy if writing else quiet).append(time.perf_counter() - begin)
            if step % args.every == 0:
                # Checkpoints far enough apart for each write to end before the next (a run
                # writes one every 100 steps): the hold is then what `save` itself costs.
                asyncio.run(writer.wait())
                holds.append(writer.start(core, Path(root) / f"step-{step}"))
        asyncio.run(writer.wait())
        # One more, timed alone: the background copy and write with nothing else running.
        holds.append(writer.start(core, Path(root) / "last"))
        begin = time.perf_counter()
        asyncio.run(writer.wait())
        writes.append(time.perf_counter() - begin)
        size = sum(p.stat().st_size for p in Path(root).rglob("*") if p.is_file()) // len(holds)
    step_s = statistics.median(quiet[1:] or quiet)  # the first step warms up
    during = statistics.median(busy) if busy else float("nan")
    result = Result(
        arch=args.arch,
        device=torch.cuda.get_device_name() if device == "cuda" else "cpu",
        batch=args.batch,
        step_s=step_s,
        hold_s=statistics.mean(holds),
        write_s=statistics.mean(writes),
        step_while_writing_s=during,
        hold_over_step=statistics.mean(holds) / step_s,
        writing_over_step=during / step_s,
        checkpoint_bytes=size,
        checkpoints=len(holds),
    )
    print(json.dumps(dataclasses.asdict(result), indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(dataclasses.asdict(result), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
