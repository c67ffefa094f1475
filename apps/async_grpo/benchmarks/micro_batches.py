"""The train step's ways of cutting its work, in ONE run: micro-batches
(`trainer.micro_batch_tokens`), a group's prompt run once (`trainer.share_prompts`) and
identical episodes run once (`trainer.merge_identical`).

    uv run python apps/async_grpo/benchmarks/micro_batches.py                # 40 steps a round
    uv run python apps/async_grpo/benchmarks/micro_batches.py --quick        # 10 steps a round
    uv run python apps/async_grpo/benchmarks/micro_batches.py --budgets 0 512 768 1024 --share off
    uv run python apps/async_grpo/benchmarks/micro_batches.py --budgets 0 --share on --merge off on

It times the tiny preset's train step (one torch thread, in this process) on two kinds of
batch of 128 episodes (8 groups of 16, each group's prompt of 4 tokens shared by its 16
episodes): "early", each response 1 to 8 tokens at random, as a random policy answers;
"late", every answer of a group N + 1 tokens long for N = 1..6, as the trained policy
counts to N and stops; "repeated", the late lengths with each group's 16 responses made of
two distinct answers (14 of one, 2 of another, each with its own log-probs and advantage), 16
distinct episodes in 128, as a trained policy repeats its answer (a default run's step-700
weights sampled 9 distinct responses in a call of 128). Each variant (a budget, prompts
shared or not, identical episodes merged or not; merged by default) gets its own copy
of the model and optimizer; the variants take turns step by step (a drift of the machine's
speed reaches them all alike), five batches of each kind in rotation. Each figure is a
median over its steps; the ratios are of medians of this run, against the first variant
(by default: the whole batch in one pass, no sharing).
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


Variant = tuple[int, bool, bool]
"""A micro-batch budget, whether prompts are shared, whether identical episodes merge."""


def _trainers(model_path: str, variants: list[Variant]) -> dict[Variant, TrainerCore]:
    """The tiny preset's trainer for each variant, each with its own model."""
    import torch  # noqa: PLC0415
    from async_grpo.actors.cores import keep_freed_memory  # noqa: PLC0415
    from async_grpo.config.presets import tiny  # noqa: PLC0415
    from async_grpo.grpo.step import TrainerCore  # noqa: PLC0415
    from async_grpo.model.policy import load_policy, load_tokenizer  # noqa: PLC0415

    torch.set_num_threads(1)
    keep_freed_memory()  # as the trainer's process does
    cfg, tok = tiny(), load_tokenizer(model_path)
    return {
        (budget, share, merge): TrainerCore(
            load_policy(model_path),
            dataclasses.replace(
                cfg.trainer, micro_batch_tokens=budget, share_prompts=share, merge_identical=merge
            ),
            cfg.sampling,
            vocab_size=len(tok),
            pad_id=int(tok.pad_token_id or 0),
            total_steps=10_000,
        )
        for budget, share, merge in variants
    }


def _batches(kind: str, count: int, seed: int) -> list[EpisodeBatch]:
    """`count` batches of 128 episodes ("early", "late" or "repeated", as the module says)."""
    import torch  # noqa: PLC0415
    from replay_buffer import Episode, EpisodeBatch  # noqa: PLC0415

    rng = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        episodes = []
        for group in range(8):
            prompt = torch.randint(2, 12, (4,), generator=rng)
            answers = []
            for i in range(16):
                n = 1 + group % 6
                length = n + 1 if kind != "early" else int(torch.randint(1, 9, (1,), generator=rng))
                answers.append(
                    Episode(
                        prompt_ids=prompt,
                        response_ids=torch.randint(2, 12, (length,), generator=rng),
                        behavior_logprobs=-torch.rand(length, generator=rng),
                        reward=float(i % 2),
                        advantage=i % 2 - 0.5,
                        policy_version=0,
                        group_id=group,
                    )
                )
            if kind == "repeated":
                answers = [answers[0]] * 14 + [answers[1]] * 2
            episodes += answers
        out.append(EpisodeBatch(episodes))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="steps per budget and kind")
    parser.add_argument("--quick", action="store_true", help="10 steps per budget and kind")
    parser.add_argument(
        "--budgets", type=int, nargs="+", default=[0, 768], help="micro_batch_tokens to compare"
    )
    parser.add_argument(
        "--merge",
        choices=["on", "off"],
        nargs="+",
        default=["on"],
        help="merge_identical settings to compare, each with every other setting (default: on)",
    )
    parser.add_argument(
        "--share",
        choices=["on", "off"],
        nargs="+",
        default=["off", "on"],
        help="share_prompts settings to compare, each with every budget (default: off on)",
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
        variants = [
            (b, share == "on", merge == "on")
            for merge in args.merge
            for share in args.share
            for b in args.budgets
        ]
        trainers = _trainers(str(path), variants)
    print(f"train step (tiny preset, 128 episodes), median of {steps}; ratio: first / this")
    for seed, kind in enumerate(("early", "late", "repeated")):
        batches = _batches(kind, 5, seed)
        for variant in variants:  # warm-up
            trainers[variant].step(batches[0], None)
        times: dict[Variant, list[float]] = {v: [] for v in variants}
        for i in range(steps):
            for variant in variants:
                start = time.perf_counter()
                trainers[variant].step(batches[i % len(batches)], None)
                times[variant].append(time.perf_counter() - start)
        first = statistics.median(times[variants[0]])
        for budget, share, merge in variants:
            median = statistics.median(times[budget, share, merge])
            print(
                f"  {kind:<8} micro_batch_tokens {budget:>5} share_prompts "
                f"{'on ' if share else 'off'} merge_identical {'on ' if merge else 'off'}: "
                f"{1e3 * median:6.1f} ms  {first / median:.2f}x"
            )


if __name__ == "__main__":
    main()
