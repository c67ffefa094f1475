"""A whole run on a GSM8K-format file with the `math` reward: the tiny random model, a few
steps, real processes. It has to run and score (the reward actor's checker process
included), not learn."""

import asyncio
import json
import random
from pathlib import Path

import pytest
from async_grpo.config.args import apply_overrides
from async_grpo.config.presets import tiny
from async_grpo.launch.prepare import prepare
from async_grpo.tasks.math_reward import math_score
from async_grpo.train import run
from jobs import rows

pytestmark = pytest.mark.slow  # a whole run


def write_gsm8k(path: Path, count: int) -> dict[str, str]:
    """`count` GSM8K-format problems (reasoning, then `#### N`); returns prompt -> target."""
    rng = random.Random(0)
    targets: dict[str, str] = {}
    with path.open("w") as f:
        for i in range(count):
            a, b = rng.randint(1, 4), rng.randint(1, 4)
            question = f"Ana has {a} apples and gets {b} more. How many apples? ({i})"
            answer = f"{a} + {b} = <<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b}"
            f.write(json.dumps({"question": question, "answer": answer}) + "\n")
            targets[question] = str(a + b)
    return targets


def test_gsm8k_file_with_the_math_reward_runs_and_scores(tmp_path: Path) -> None:
    targets = write_gsm8k(tmp_path / "gsm8k.jsonl", 16)
    cfg = apply_overrides(
        tiny(),
        {
            "steps": "3",
            "out_dir": str(tmp_path / "run"),
            "data.path": str(tmp_path / "gsm8k.jsonl"),
            "data.format": "gsm8k",
            "reward.fns": "math",
            "trace": "false",
        },
    )
    summary = asyncio.run(run(cfg, prepare(cfg), quiet=True))
    assert summary.steps == 3
    run_rows = rows(tmp_path / "run")
    assert [r["version"] for r in run_rows] == [1, 2, 3]
    # The targets are small numbers the tiny model's vocabulary holds: some random answers
    # end on the right one (about 1 in 10).
    assert any(r["reward_window"] > 0 for r in run_rows)
    # Every scored response got what the math reward gives it here: the reward service
    # scored with `math` against the targets read from the file.
    shown = list(summary.metrics.recent)
    assert shown
    assert all(s.reward == math_score(s.response, targets[s.prompt]) for s in shown), shown
    assert summary.eval_end is not None  # the final evaluation scored too
