"""`async-grpo eval MODEL_DIR_OR_CHECKPOINT [options]`: scores a model on a task or a dataset
with the app's reward functions: mean reward, pass@1 and pass@k, one row per prompt.

    uv run async-grpo eval runs/async-grpo                 # its newest checkpoint, the run's task
    uv run async-grpo eval runs/async-grpo/checkpoint-tiny-seed0   # the weights it started from
    uv run async-grpo eval exported/tiny --samples 8 --json eval.json
    uv run async-grpo eval exported/tiny --greedy
    uv run async-grpo eval /path/to/Qwen2.5-0.5B-Instruct --data.path math.jsonl \\
        --reward.fns numeric:0.9,format:0.1 --model.chat_template true

MODEL_DIR_OR_CHECKPOINT: a run directory (its newest complete checkpoint), a checkpoint
(`checkpoints/step-NNNNNN`), an export (`async-grpo export`; an adapter-only export is
merged onto the base model its adapter config names), any Hugging Face model directory, or
a hub id already in the local cache (nothing is downloaded).

The defaults are the run's (a checkpoint's or an export's config; for another model, the
`--preset`'s, `tiny` by default): its eval set (`--data.*`, `--eval_prompts`), reward
functions (`--reward.fns`), sampling distribution (`--sampling.temperature`, `top_p`,
`max_new_tokens`), `--seed`, `--model.chat_template`, `--model.dtype` and `--device`. The
set, the seeds and the scoring are the run's periodic evaluation's
(`observability/scoring.py`), so a checkpoint evaluated with the run's settings scores what
the run recorded for those weights. A dataset given here (`--data.path FILE.jsonl`,
`--data.hf_name`) is scored whole unless `--eval_prompts N` limits it to its first N.

    --samples K        answers sampled per prompt (default: the run's sampling.group_size);
                       reports pass@1 and pass@K
    --greedy           one answer per prompt, each token the most likely one (pass@1)
    --correct_at R     an answer counts as correct for pass@k when its reward is >= R
                       (default 1.0: the whole target for the `count` and `exact` rewards,
                       the right number for `numeric`)
    --json PATH        also write the numbers and every prompt's answers and rewards
    --batch_prompts N  prompts sampled in one batch (default 64; the first batch is seeded as
                       the run's evaluation)

pass@k is the unbiased estimator of Chen et al. 2021 from the K answers of each prompt,
averaged over prompts. Samples in this process with the `hf` engine (no Monarch process);
a progress bar on a terminal. Bad input is one line on stderr, exit status 2, nothing run.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm  # type: ignore[import-untyped]

from async_grpo.checkpoint.export import load_adapter_export, load_checkpoint
from async_grpo.cli.eval_options import EvalOptions, parse_args
from async_grpo.generation.engines.hf import HFEngine
from async_grpo.launch.prepare import load_samples
from async_grpo.observability.scoring import (
    PromptScore,
    eval_prompts,
    eval_seed,
    fold,
    mean_exact,
    mean_pass_at,
    mean_reward,
    reward_inputs,
)
from async_grpo.tasks.prompts import Sample
from async_grpo.tasks.rewards import RewardFn, combined, parse_weights

PROG = "async-grpo eval"


def evaluate(
    engine: HFEngine,
    prompts: Sequence[Sample],
    reward: RewardFn,
    *,
    seed: int,
    step: int,
    batch_prompts: int,
    progress: Callable[[int], object] = lambda n: None,
) -> list[PromptScore]:
    """Samples every prompt's answers with `engine`, `batch_prompts` prompts at a time (batch
    i seeded `eval_seed(seed, step, i)`), scores them with `reward` and folds them into
    one row per prompt; `progress(n)` after each batch of n prompts."""
    rows: list[PromptScore] = []
    for i, start in enumerate(range(0, len(prompts), batch_prompts)):
        batch = list(prompts[start : start + batch_prompts])
        groups = engine.generate([s.prompt for s in batch], eval_seed(seed, step, i))
        texts, targets = reward_inputs(batch, groups)
        rows += fold(batch, groups, [reward(t, g) for t, g in zip(texts, targets, strict=True)])
        progress(len(batch))
    return rows


def report(o: EvalOptions, rows: Sequence[PromptScore]) -> dict[str, Any]:
    """The numbers of an evaluation, as `--json` writes them."""
    ks = sorted({1, o.samples})
    s = o.cfg.sampling
    return {
        "model": o.target.model_dir,
        "checkpoint": str(o.target.checkpoint) if o.target.checkpoint else None,
        "version": o.target.version,
        "data": dataclasses.asdict(o.cfg.data),
        "reward_fns": o.cfg.reward.fns,
        "samples": o.samples,
        "greedy": o.greedy,
        "sampling": {
            "temperature": s.temperature,
            "top_p": s.top_p,
            "max_new_tokens": s.max_new_tokens,
        },
        "seed": o.cfg.seed,
        "correct_at": o.correct_at,
        "prompts": len(rows),
        "mean_reward": mean_reward(rows),
        "exact": mean_exact(rows),
        "pass_at": {str(k): mean_pass_at(rows, k, o.correct_at) for k in ks},
        "rows": [
            {
                "prompt": r.prompt,
                "target": r.target,
                "reward": r.reward,
                "correct": r.correct(o.correct_at),
                "pass_at": {str(k): r.pass_at(k, o.correct_at) for k in ks},
                "answers": list(r.answers),
                "rewards": list(r.rewards),
            }
            for r in rows
        ],
    }


@dataclasses.dataclass(frozen=True)
class Loaded:
    """What an evaluation runs on: the engine (the model loaded), the eval set, the reward."""

    engine: HFEngine
    prompts: list[Sample]
    reward: RewardFn


def load(o: EvalOptions) -> Loaded:
    """Reads the dataset and loads the model (bad input raises here, before any sampling)."""
    samples = load_samples(o.cfg)
    size = len(samples) if o.whole_dataset and samples else o.cfg.eval_prompts
    prompts = eval_prompts(o.cfg.data, samples, size)
    sampling = dataclasses.replace(o.cfg.sampling, group_size=o.samples)
    model_dir, policy = o.target.model_dir, None
    if o.target.checkpoint is not None:
        loaded = load_checkpoint(o.target.checkpoint)
        model_dir, policy = loaded.base, loaded.model  # the base model's tokenizer
    elif o.target.adapter:
        policy = load_adapter_export(Path(model_dir))  # its tokenizer is beside the adapter
    engine = HFEngine(
        model_dir, o.cfg.model, sampling, o.cfg.seed, o.cfg.device, policy=policy, greedy=o.greedy
    )
    return Loaded(engine, prompts, combined(parse_weights(o.cfg.reward.fns)))


def run(o: EvalOptions, loaded: Loaded) -> dict[str, Any]:
    """Samples and scores the eval set with a progress bar; returns `report`'s numbers."""
    bar = tqdm(total=len(loaded.prompts), unit="prompt", desc="eval", disable=None, file=sys.stderr)
    with bar:
        rows = evaluate(
            loaded.engine,
            loaded.prompts,
            loaded.reward,
            seed=o.cfg.seed,
            step=o.target.version,
            batch_prompts=o.batch_prompts,
            progress=bar.update,
        )
    return report(o, rows)


def summary_lines(o: EvalOptions, numbers: dict[str, Any]) -> list[str]:
    """What the command prints: the numbers, then one line per prompt."""
    passes = "  ".join(f"pass@{k} {v:.3f}" for k, v in numbers["pass_at"].items())
    lines = [
        f"mean reward {numbers['mean_reward']:.3f}  exact {numbers['exact']:.3f}  {passes}  "
        f"(correct: reward >= {o.correct_at:g})"
    ]
    for row in numbers["rows"]:
        row_passes = "  ".join(f"pass@{k} {v:.2f}" for k, v in row["pass_at"].items())
        lines.append(
            f"    {row['prompt']!r}: reward {row['reward']:.3f}  {row_passes}  "
            f"first answer {row['answers'][0]!r}"
        )
    return lines


def main(argv: list[str]) -> int:
    """`async-grpo eval MODEL_DIR_OR_CHECKPOINT [options]`: exit status 0, 2 on bad input
    (one line on stderr, nothing sampled or written)."""
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    try:
        options = parse_args(argv)
        loaded = load(options)
    except (ValueError, OSError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    print(describe(options, len(loaded.prompts)))
    numbers = run(options, loaded)
    print("\n".join(summary_lines(options, numbers)))
    if options.json_path is not None:
        options.json_path.write_text(json.dumps(numbers, indent=1) + "\n")
        print(f"json: {options.json_path}")
    return 0


def describe(o: EvalOptions, prompts: int) -> str:
    """The command's first line: what is evaluated, on what, how."""
    s, data = o.cfg.sampling, o.cfg.data
    task = data.path or data.hf_name or data.task
    how = "greedy" if o.greedy else f"{o.samples} samples each"
    return (
        f"{PROG}: {o.target.model_dir} (version {o.target.version}) | {task}: {prompts} "
        f"prompts, {how} | reward {o.cfg.reward.fns} | temperature {s.temperature:g} top_p "
        f"{s.top_p:g} max_new_tokens {s.max_new_tokens} | seed {o.cfg.seed}"
    )
