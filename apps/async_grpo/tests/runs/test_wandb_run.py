"""A whole run with `--metrics.wandb` in W&B's offline mode: the run's W&B directory holds
every row of metrics.jsonl (read back from its `.wandb` file, no server), the config and
the report."""

import asyncio
import importlib.util
from pathlib import Path

import pytest
from async_grpo.config.args import apply_overrides
from async_grpo.config.presets import tiny
from async_grpo.launch.prepare import prepare
from async_grpo.train import run
from jobs import rows
from wandb_files import read_offline_run, run_dirs

pytestmark = [
    pytest.mark.slow,  # a whole run
    pytest.mark.skipif(
        importlib.util.find_spec("wandb") is None,
        reason="needs the `wandb` package: uv sync --extra wandb (the nox session installs it)",
    ),
]


def test_an_offline_wandb_run_holds_the_rows_config_and_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")  # nothing leaves the machine
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    out = tmp_path / "run"
    cfg = apply_overrides(
        tiny(),
        {"steps": "4", "out_dir": str(out), "metrics.wandb": "async-grpo-tests", "seed": "3"},
    )
    summary = asyncio.run(run(cfg, prepare(cfg), quiet=True))
    assert summary.steps == 4

    (run_dir,) = run_dirs(out)
    logged = read_offline_run(run_dir)
    steps = [h for h in logged.history if "reward_window" in h]
    written = rows(out)
    assert [h["version"] for h in steps] == [r["version"] for r in written] == [1, 2, 3, 4]
    for key in ("reward_window", "loss", "grad_norm", "lr", "entropy", "episodes_trained"):
        assert [h[key] for h in steps] == pytest.approx([r[key] for r in written]), key
    assert logged.config["seed"] == 3
    assert logged.config["trainer"]["batch_size"] == cfg.trainer.batch_size
    # The report of the finished run (its trace included), as `async-grpo report` writes it.
    assert "Run report" in (out / "report.html").read_text()
    (report,) = [h for h in logged.history if "report/path" in h]
    assert report["report/path"] in logged.files
