"""End-to-end: sync mode is the same loop on-policy, and groups that teach nothing can be
filtered out. (That the default async loop learns: `test_export_eval.py`, whose full run is
the fixed-seed CI run.)

Real Monarch processes, a real tiny Qwen2 checkpoint written and loaded back, real weight
sync through rdma-tensor and the replay-buffer actor.
"""

import asyncio
import json
from pathlib import Path

import pytest
from async_grpo.config.args import apply_overrides
from async_grpo.config.presets import tiny
from async_grpo.launch.prepare import prepare
from async_grpo.train import run
from jobs import unaccounted

pytestmark = pytest.mark.slow  # a whole run (or a whole set of processes)


def test_sync_mode_trains_only_on_the_current_version(tmp_path: Path) -> None:
    cfg = apply_overrides(
        tiny(),
        # Tracing off here too (every other whole run traces): nothing of a trace is written.
        {
            "mode": "sync",
            "steps": "6",
            "out_dir": str(tmp_path),
            "generator.replicas": "1",
            "trace": "false",
        },
    )
    summary = asyncio.run(run(cfg, prepare(cfg), quiet=True))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert summary.steps == 6
    assert [r["version"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert all(r["staleness_mean"] == 0.0 for r in rows)
    # The prompt ledger hands out one batch of prompts per version, generated on that
    # version's weights: nothing is generated that is not trained. (Before the ledger, this
    # run generated 1536 episodes for 768 trained; before that, 3328: the rest ran on the
    # outgoing weights during the step and was dropped as stale.)
    assert rows[-1]["episodes_generated"] == 6 * cfg.trainer.batch_size
    assert rows[-1]["episodes_trained"] == 6 * cfg.trainer.batch_size  # the first step too
    assert [unaccounted(r) for r in rows] == [0] * len(rows)
    trained = [json.loads(x)["prompts"] for x in (tmp_path / "trained_prompts.jsonl").open()]
    assert trained == [list(range(8 * k, 8 * k + 8)) for k in range(6)]
    assert not (tmp_path / "trace.json").exists()
    assert not (tmp_path / "trace").exists()
    assert json.loads((tmp_path / "config.json").read_text())["trace"] is False


def test_groups_that_teach_nothing_are_filtered_and_replaced(tmp_path: Path) -> None:
    # Sync mode, fixed seed: the run repeats, and a dropped group's prompt is replaced by a
    # new one, so every batch is still whole. Seed 3 draws two uniform groups in these three
    # steps (seed 0 drew none once a group's prompt was prefilled once; seeds 1 and 2 one).
    cfg = apply_overrides(
        tiny(),
        {
            "mode": "sync",
            "steps": "3",
            "seed": "3",
            "out_dir": str(tmp_path),
            "buffer.drop_uniform_groups": "true",
            "eval_every": "0",
            "trace": "false",
        },
    )
    asyncio.run(run(cfg, prepare(cfg), quiet=True))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["version"] for r in rows] == [1, 2, 3]
    assert all(r["uniform_groups"] == 0.0 for r in rows)  # none reached a batch
    assert rows[-1]["episodes_filtered"] > 0  # a random model's groups often are uniform
    assert rows[-1]["episodes_trained"] == 3 * cfg.trainer.batch_size
    assert (
        rows[-1]["episodes_generated"]
        == 3 * cfg.trainer.batch_size + (rows[-1]["episodes_filtered"])
    )
    assert [unaccounted(r) for r in rows] == [0] * 3
