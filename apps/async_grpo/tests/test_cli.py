"""Bad input on the command line: a clear error, exit status 2, and no process spawned."""

from pathlib import Path

import async_grpo.loop
import pytest
from async_grpo.cli import build_config, main
from async_grpo.presets import PRESETS, default_preset


@pytest.fixture(autouse=True)
def no_spawning(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a process would have been spawned")

    monkeypatch.setattr(async_grpo.loop, "spawn_components", refuse)


def run_main(args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main([*args, "--out_dir", str(tmp_path / "out")]) == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sampling.group_size", "1"], "sampling.group_size must be >= 2"),
        (["--trainer.lr", "0"], "trainer.lr must be > 0"),
        (["--buffer.max_policy_age", "-1"], "buffer.max_policy_age must be >= 0"),
        (["--trainer.lrr", "1e-3"], "unknown config key 'trainer.lrr'"),
        (["--trainer.lr", "fast"], "trainer.lr: expected float, got 'fast'"),
        (["--preset", "huge"], "unknown preset 'huge'"),
        (["--reward.fns", "count,nope"], "unknown reward function"),
        (["stray"], "unexpected argument 'stray'"),
        (["--steps"], "--steps needs a value"),
    ],
)
def test_bad_config_is_an_error(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in run_main(args, tmp_path, capsys)


def test_missing_model_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = run_main(["--model", str(tmp_path / "no-such-model")], tmp_path, capsys)
    assert "model checkpoint not found" in err
    assert "--preset tiny" in err


def test_model_directory_without_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    err = run_main(["--model", str(tmp_path / "empty")], tmp_path, capsys)
    assert "no config.json" in err


def test_malformed_dataset_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "count to 2:", "target": "1 2"}\n{"prompt": oops}\n')
    err = run_main(["--data.path", str(data)], tmp_path, capsys)
    assert f"{data}:2: malformed JSON" in err


def test_short_forms_and_equals_syntax() -> None:
    cfg = build_config(["--preset", "tiny", "--mode=sync", "--model", "/m", "--steps", "7"])
    assert (cfg.mode, cfg.model.path, cfg.steps) == ("sync", "/m", 7)


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "uv run async-grpo" in out
    # Every key is listed with the value the default preset gives it, in CLI syntax.
    cfg = PRESETS[default_preset()]()
    assert f"\n  --trainer.lr {cfg.trainer.lr}\n" in out
    assert f"\n  --trainer.scale_by_std {str(cfg.trainer.scale_by_std).lower()}\n" in out
    assert f"\n  --buffer.max_policy_age {cfg.buffer.max_policy_age}\n" in out
