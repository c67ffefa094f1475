"""`--metrics.wandb`: the sink's rows, the config and the report in an offline W&B run (read
back from its `.wandb` file, no server), a resumed run continuing it, and each way W&B can
be refused: not installed, a bad project name, online without an API key."""

import importlib.util
import sys
from pathlib import Path

import pytest
from async_grpo.checkpoint.resume import config_differences
from async_grpo.cli.main import main
from async_grpo.config.args import apply_overrides
from async_grpo.config.presets import tiny
from async_grpo.config.schema import ConfigError, RunConfig
from async_grpo.observability.metrics import StepRow
from async_grpo.observability.sink import MetricsSink
from async_grpo.observability.wandb_run import RUN_ID_FILE, WandbRun
from jobs import refuse_spawn
from synthetic_runs import step_row
from wandb_files import read_offline_run, run_dirs

NEEDS_WANDB = pytest.mark.skipif(
    importlib.util.find_spec("wandb") is None,
    reason="needs the `wandb` package: uv sync --extra wandb (the nox session installs it)",
)


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B's offline mode: everything stays in the run's directory, nothing is sent."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


def config(out_dir: Path, **overrides: str) -> RunConfig:
    return apply_overrides(
        tiny(), {"out_dir": str(out_dir), "metrics.wandb": "async-grpo-tests", **overrides}
    )


def row(version: int) -> StepRow:
    values = step_row(
        version=version,
        reward_window=0.1 * version,
        loss=-0.5 + version,
        eval_reward=None,
        weight_sync_transport="shm",
    )
    return StepRow(**values)


@NEEDS_WANDB
@pytest.mark.usefixtures("offline")
@pytest.mark.slow  # W&B's own service process
def test_rows_config_and_report_reach_an_offline_run(tmp_path: Path) -> None:
    cfg = config(tmp_path, **{"trainer.lr": "0.0005"})
    wandb = WandbRun(cfg, tmp_path, resume=False)
    sink = MetricsSink(tmp_path, wandb)
    for version in (1, 2, 3):
        sink.write(row(version), prompts=[version])
    sink.close()

    (run_dir,) = run_dirs(tmp_path)
    assert run_dir == wandb.dir
    assert run_dir.name.startswith("offline-run-")
    assert run_dir.name.endswith("-" + (tmp_path / RUN_ID_FILE).read_text())
    run = read_offline_run(run_dir)
    steps = [h for h in run.history if "reward_window" in h]
    assert [h["version"] for h in steps] == [1, 2, 3]
    assert [h["reward_window"] for h in steps] == pytest.approx([0.1, 0.2, 0.3])
    assert [h["loss"] for h in steps] == pytest.approx([0.5, 1.5, 2.5])
    # Numbers only: a value not known yet (None) and text are left out.
    assert all("eval_reward" not in h and "weight_sync_transport" not in h for h in steps)
    assert run.config["trainer"]["lr"] == 0.0005
    assert run.config["metrics"]["wandb"] == "async-grpo-tests"
    # The report, written at the end from metrics.jsonl, logged as an HTML page.
    assert (tmp_path / "report.html").exists()
    (report,) = [h for h in run.history if "report/_type" in h]
    assert report["report/_type"] == "html-file"
    assert (run_dir / "files" / report["report/path"]).read_text().startswith("<")


@NEEDS_WANDB
@pytest.mark.usefixtures("offline")
def test_a_failed_run_ends_its_wandb_run_without_a_report(tmp_path: Path) -> None:
    sink = MetricsSink(tmp_path, WandbRun(config(tmp_path), tmp_path, resume=False))
    sink.write(row(1))
    sink.close(failed=True)
    (run_dir,) = run_dirs(tmp_path)
    assert [h["version"] for h in read_offline_run(run_dir).history] == [1]
    assert not (tmp_path / "report.html").exists()


@NEEDS_WANDB
@pytest.mark.usefixtures("offline")
def test_a_resumed_run_continues_the_same_wandb_run(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    first = WandbRun(cfg, tmp_path, resume=False)
    first.finish(tmp_path, failed=True)
    run_id = (tmp_path / RUN_ID_FILE).read_text()
    second = WandbRun(cfg, tmp_path, resume=True)
    second.finish(tmp_path, failed=True)
    fresh = WandbRun(cfg, tmp_path, resume=False)
    fresh.finish(tmp_path, failed=True)
    assert first.id == second.id == run_id
    assert fresh.id != run_id  # a new run in the directory is a new W&B run
    assert (tmp_path / RUN_ID_FILE).read_text() == fresh.id
    assert all(run_id in d.name for d in (first.dir, second.dir))


@NEEDS_WANDB
def test_online_without_an_api_key_is_one_line_and_spawns_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc holding a key
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    cfg = config(tmp_path, **{"metrics.wandb_mode": "online"})
    with pytest.raises(ConfigError, match=r"^metrics\.wandb: W&B did not start: ") as e:
        WandbRun(cfg, tmp_path, resume=False)
    assert "\n" not in str(e.value)
    assert not (tmp_path / RUN_ID_FILE).exists()
    # From the command line: the same line, before any process starts.
    out = tmp_path / "out"
    args = ["--preset", "tiny", "--metrics.wandb", "p", "--metrics.wandb_mode", "online"]
    assert main([*args, "--out_dir", str(out)], spawn=refuse_spawn) == 2
    err = capsys.readouterr().err
    assert err.startswith("async-grpo: error: metrics.wandb: W&B did not start: "), err
    assert err.count("\n") == 1
    assert not (out / "metrics.jsonl").exists()


def test_wandb_not_installed_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # what importing it finds: nothing
    out = tmp_path / "out"
    args = ["--preset", "tiny", "--metrics.wandb", "p", "--out_dir", str(out)]
    assert main(args, spawn=refuse_spawn) == 2
    err = capsys.readouterr().err
    assert err == (
        "async-grpo: error: metrics.wandb: logging to W&B needs the `wandb` package, which is "
        "not installed: `uv sync --extra wandb` (or `pip install 'async-grpo[wandb]'`)\n"
    )
    assert not out.exists()


@pytest.mark.parametrize("project", ["team/project", "a:b", "x" * 129])
def test_a_bad_project_name_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], project: str
) -> None:
    out = tmp_path / "out"
    args = ["--preset", "tiny", "--metrics.wandb", project, "--out_dir", str(out)]
    assert main(args, spawn=refuse_spawn) == 2
    err = capsys.readouterr().err
    assert err.startswith("async-grpo: error: metrics.wandb must be a W&B project name"), err
    assert err.count("\n") == 1
    assert not out.exists()


def test_a_resumed_run_may_change_where_its_metrics_go(tmp_path: Path) -> None:
    saved = apply_overrides(tiny(), {"out_dir": str(tmp_path)})
    now = config(tmp_path, **{"metrics.wandb_mode": "offline"})
    assert config_differences(saved, now) == []
    assert config_differences(saved, apply_overrides(now, {"seed": "1"})) != []
