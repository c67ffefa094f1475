"""End-to-end with the vLLM engine: the tiny preset learns to count as it does with `hf`.

Needs vLLM (`uv sync --extra vllm`; the nox session `vllm` runs this module); skipped
without it.
"""

import importlib
import json
import os
from pathlib import Path

import pytest
from async_grpo.config.args import apply_overrides
from async_grpo.config.presets import tiny
from async_grpo.launch.prepare import prepare
from async_grpo.launch.signals import run_watched
from async_grpo.train import run

pytestmark = pytest.mark.slow  # a whole run (or a whole set of processes)

if os.environ.get("ASYNC_GRPO_REQUIRE_VLLM") == "1":  # the nox session: fail, never skip
    importlib.import_module("vllm")
else:
    pytest.importorskip("vllm", reason="needs vLLM: uv sync --extra vllm")


# The run may take its `max_minutes` (6): more than pytest's default timeout (300 s), which
# a slower machine's run (AVX2 only: 66 s to its first step) comes close to.
@pytest.mark.timeout(600)
def test_tiny_preset_with_vllm_reaches_a_windowed_reward_of_09(tmp_path: Path) -> None:
    overrides = {
        "steps": "400",  # the budget; the run stops at the first full window >= 0.9
        "stop_at_reward": "0.9",
        "seed": "0",
        "out_dir": str(tmp_path),
        "max_minutes": "6",
        "generator.engine": "vllm",
        "generator.kv_cache_gib": "0.25",
    }
    cfg = apply_overrides(tiny(), overrides)
    # As the command runs it: a SIGINT or SIGTERM that stops the run is named with its
    # sender, in the summary the assertions below print.
    summary = run_watched(run(cfg, prepare(cfg), quiet=True))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert summary.reward_start <= 0.3, summary
    assert summary.reached_09_step is not None, summary
    assert rows[-1]["reward_window"] >= 0.9, rows[-1]
    assert summary.steps < 400, summary  # stopped by the reward, not the budget
