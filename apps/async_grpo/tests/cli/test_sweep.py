"""`async-grpo sweep` and `async-grpo report` on the command line: the runs a sweep plans,
and bad input rejected with one line and exit status 2 before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from async_grpo.cli.sweep import configs, main, parse_ages
from async_grpo.config.presets import tiny
from async_grpo.config.schema import ConfigError
from async_grpo.observability.report import build as report
from jobs import refuse_spawn
from synthetic_runs import write_run


def test_one_config_per_bound(tmp_path: Path) -> None:
    base = tiny()
    base.mode = "sync"
    cfgs = configs(base, (0, 1, 2, 4), tmp_path)
    assert [c.effective_max_policy_age for c in cfgs] == [0, 1, 2, 4]
    assert [Path(c.out_dir).name for c in cfgs] == ["age-0", "age-1", "age-2", "age-4"]
    assert base.mode == "sync"  # the base is not modified
    assert {c.trainer.lr for c in cfgs} == {base.trainer.lr}


@pytest.mark.parametrize(
    ("raw", "message"),
    [("0", "at least two"), ("0,0", "distinct"), ("1,-1", ">= 0"), ("a,b", "integers")],
)
def test_bad_ages(raw: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_ages(raw)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ages", "3"], "--ages: need at least two"),
        (["--mode", "sync"], "--mode: the sweep sets it"),
        (["--buffer.max_policy_age=2"], "--buffer.max_policy_age: the sweep sets it"),
        (["--trainer.lr", "0"], "trainer.lr"),
        (["--ages"], "--ages needs a value"),
    ],
)
def test_bad_sweep_input_is_one_line(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*args, "--out_dir", str(tmp_path / "s")], spawn=refuse_spawn) == 2
    err = capsys.readouterr().err
    assert err.startswith("async-grpo sweep: error:")
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "s").exists()


def test_report_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert report.main([str(tmp_path / "nothing")]) == 2
    assert "async-grpo report: error:" in capsys.readouterr().err
    run_dir = write_run(tmp_path / "run", 1)
    assert report.main([str(run_dir), "--out", str(tmp_path / "r.html")]) == 0
    assert (tmp_path / "r.html").stat().st_size > 1_000_000
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "sweep.json").write_text('{"runs": []}')
    assert report.main([str(tmp_path / "bad")]) == 2
    assert "no runs" in capsys.readouterr().err
