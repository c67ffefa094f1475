"""The train step in one pass against micro-batches (`trainer.micro_batch_tokens`), in ONE run.

    uv run python apps/async_grpo/benchmarks/micro_batches.py                # 40 steps a round
    uv run python apps/async_grpo/benchmarks/micro_batches.py --quick        # 10 steps a round
    uv run python apps/async_grpo/benchmarks/micro_batches.py --budgets 0 512 768 1024

It times the tiny preset's train step (one torch thread, in this process) on two kinds of
batch of 128 episodes (8 groups of 16, prompts of 4 tokens): "early", each response 1 to 8
tokens at random, as a random policy answers; "late", every answer of a group N + 1 tokens
long for N = 1..6, as the trained policy counts to N and stops. Every budget gets its own
copy of the model and optimizer; the budgets take turns step by step (a drift of the
machine's speed reaches them all alike), five batches of each kind in rotation. Each
figure is a median over its steps; the ratios are of medians of this run, against the
first budget (0: the whole batch in one pass).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from async_grpo.grpo.step import TrainerCore
    from replay_buffer import EpisodeBatch


def _trainers(model_path: str, budgets: list[int]) -> dict[int, TrainerCore]:
    """The tiny preset's trainer for each budget, each with its own model."""
    import torch  # noqa: PLC0415
    from async_grpo.config.presets import tiny  # noqa: PLC0415
    from async_grpo.grpo.step import TrainerCore  # noqa: PLC0415
    from async_grpo.model.policy import load_policy, load_tokenizer  # noqa: PLC0415

    torch.set_num_threads(1)
    cfg, tok = tiny(), load_tokenizer(model_path)
    return {
        budget: TrainerCore(
            load_policy(model_path),
            dataclasses.replace(cfg.trainer, micro_batch_tokens=budget),
            cfg.sampling,
            vocab_size=len(tok),
            pad_id=int(tok.pad_token_id or 0),
            total_steps=10_000,
        )
        for budget in budgets
    }


def _batches(kind: str, count: int, seed: int) -> list[EpisodeBatch]:
    """`count` batches of 128 episodes ("early" or "late" response lengths)."""
    import torch  # noqa: PLC0415
    from replay_buffer import Episode, EpisodeBatch  # noqa: PLC0415

    rng = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        episodes = []
        for group in range(8):
            for i in range(16):
                n = 1 + group % 6
                length = n + 1 if kind == "late" else int(torch.randint(1, 9, (1,), generator=rng))
                episodes.append(
                    Episode(
                        prompt_ids=torch.randint(2, 12, (4,), generator=rng),
                        response_ids=torch.randint(2, 12, (length,), generator=rng),
                        behavior_logprobs=-torch.rand(length, generator=rng),
                        reward=float(i % 2),
                        advantage=i % 2 - 0.5,
                        policy_version=0,
                        group_id=group,
                    )
                )
        out.append(EpisodeBatch(episodes))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="steps per budget and kind")
    parser.add_argument("--quick", action="store_true", help="10 steps per budget and kind")
    parser.add_argument(
        "--budgets", type=int, nargs="+", default=[0, 768], help="micro_batch_tokens to compare"
    )
    args = parser.parse_args()
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    if any(b < 0 for b in args.budgets):
        parser.error(f"--budgets must be >= 0, got {args.budgets}")
    steps = 10 if args.quick else args.steps
    from async_grpo.config.presets import TINY_ARCH  # noqa: PLC0415
    from async_grpo.model.policy import write_random_checkpoint  # noqa: PLC0415
    from async_grpo.tasks.prompts import corpus_for  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        path = write_random_checkpoint(Path(tmp), TINY_ARCH, corpus_for("count", 1, 6), seed=0)
        trainers = _trainers(str(path), args.budgets)
    print(f"train step (tiny preset, 128 episodes), median of {steps}; ratio: first / this")
    for seed, kind in enumerate(("early", "late")):
        batches = _batches(kind, 5, seed)
        for budget in args.budgets:  # warm-up
            trainers[budget].step(batches[0], None)
        times: dict[int, list[float]] = {b: [] for b in args.budgets}
        for i in range(steps):
            for budget in args.budgets:
                start = time.perf_counter()
                trainers[budget].step(batches[i % len(batches)], None)
                times[budget].append(time.perf_counter() - start)
        first = statistics.median(times[args.budgets[0]])
        for budget in args.budgets:
            median = statistics.median(times[budget])
            print(
                f"  {kind:<5} micro_batch_tokens {budget:>5}: {1e3 * median:6.1f} ms  "
                f"{first / median:.2f}x"
            )


if __name__ == "__main__":
    main()
