"""Bad input on the command line: a one-line error, exit status 2, and no process spawned."""

from pathlib import Path

import async_grpo.cli.main
import pytest
from async_grpo.cli.main import main
from async_grpo.config.args import build_config
from async_grpo.config.presets import DEFAULT_PRESET, PRESETS, qwen25_05b, tiny
from async_grpo.grpo.step import NonFiniteError
from async_grpo.launch.spawn import Components
from jobs import refuse_spawn
from monarch.actor import ActorError


def run_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Runs the command, expects the bad-input exit, and returns its one error line."""
    assert main(args, spawn=refuse_spawn) == 2
    err = capsys.readouterr().err
    assert err.startswith("async-grpo: error: "), err
    assert err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sampling.group_size", "1"], "sampling.group_size must be >= 2"),
        (["--trainer.lr", "0"], "trainer.lr must be > 0"),
        (["--buffer.max_policy_age", "-1"], "buffer.max_policy_age must be >= 0"),
        (
            ["--trainer.lrr", "1e-3"],
            "unknown config key 'trainer.lrr' (did you mean 'trainer.lr'?)",
        ),
        (["--trainer.lr", "fast"], "trainer.lr: expected float, got 'fast'"),
        (["--preset", "huge"], "unknown preset 'huge'"),
        (["--preset"], "--preset needs a value"),
        (["--reward.fns", "count,nope"], "reward.fns: unknown reward function"),
        (["stray"], "unexpected argument 'stray'"),
        (["--steps"], "--steps needs a value"),
        (["--steps", "0"], "steps must be >= 1, got 0"),
        (["--sampling.top_p", "2"], "sampling.top_p must be in (0, 1], got 2.0"),
        (["--model.dtype", "fp16"], "model.dtype: 'fp16' is not one of ['float32', 'bfloat16']"),
        (["--model.arch", "huge"], "model.arch: unknown architecture 'huge'"),
        (["--trainer.procs", "0"], "trainer.procs must be >= 1, got 0"),
        (
            ["--trainer.batch_size", "7"],
            "trainer.batch_size (7) must be a positive multiple of sampling.group_size (16)",
        ),
        (["--model.chat_template", "maybe"], "model.chat_template: expected true or false"),
        (["--trainer.advantage_scale", "max"], "trainer.advantage_scale"),
        (["--trainer.kl_coef", "0.1"], "(did you mean 'trainer.loss.kl_coef'?)"),
        (["--log_every", "0"], "log_every must be >= 1"),
        (["--data.path", "/nonexistent/data.jsonl"], "data.path: dataset file not found"),
    ],
)
def test_bad_config_is_a_one_line_error(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert message in run_main(["--preset", "tiny", *args, "--out_dir", str(out)], capsys)
    assert not out.exists()  # rejected before anything was written


def test_out_dir_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "f").write_text("")
    err = run_main(["--out_dir", str(tmp_path / "f")], capsys)
    assert f"out_dir: {tmp_path / 'f'} exists and is not a directory" in err
    err = run_main(["--out_dir", str(tmp_path / "f" / "sub")], capsys)
    assert "out_dir: cannot create" in err
    assert "Not a directory" in err


def test_out_dir_that_cannot_be_created(capsys: pytest.CaptureFixture[str]) -> None:
    assert "out_dir: cannot create /proc/x" in run_main(["--out_dir", "/proc/x"], capsys)


def test_data_path_that_is_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = run_main(["--data.path", str(tmp_path), "--out_dir", str(tmp_path / "o")], capsys)
    assert f"data.path: {tmp_path} is a directory" in err


def test_missing_model_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = run_main(["--model", str(tmp_path / "no-such-model")], capsys)
    assert "model not found" in err
    assert "--preset tiny" in err


def test_model_directory_without_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    err = run_main(["--model", str(tmp_path / "empty")], capsys)
    assert "no config.json" in err


def test_malformed_dataset_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "count to 2:", "target": "1 2"}\n{"prompt": oops}\n')
    err = run_main(["--data.path", str(data), "--out_dir", str(tmp_path / "o")], capsys)
    assert f"data.path: {data}:2: malformed JSON" in err


def test_short_forms_and_equals_syntax() -> None:
    cfg = build_config(["--preset", "tiny", "--mode=sync", "--model", "/m", "--steps", "7"])
    assert (cfg.mode, cfg.model.path, cfg.steps) == ("sync", "/m", 7)
    assert build_config(["--model=/n", "--seed", "3"]).model.path == "/n"


def test_nested_loss_key_on_the_command_line() -> None:
    cfg = build_config(["--preset", "tiny", "--trainer.loss.kl_coef", "0.05"])
    assert cfg.trainer.loss.kl_coef == 0.05
    assert cfg.trainer.loss.entropy_coef == tiny().trainer.loss.entropy_coef


def test_preset_selects_the_defaults() -> None:
    assert build_config([]) == PRESETS[DEFAULT_PRESET]() == tiny()  # on every machine
    assert build_config(["--preset", "qwen2.5-0.5b"]) == qwen25_05b()
    cfg = build_config(["--steps", "5", "--preset=qwen2.5-0.5b"])  # anywhere on the line
    assert (cfg.steps, cfg.trainer.lr, cfg.model.dtype) == (5, qwen25_05b().trainer.lr, "bfloat16")


def test_subcommands_are_dispatched_before_config_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def report(args: list[str]) -> int:
        seen.append(args)
        return 7

    monkeypatch.setitem(async_grpo.cli.main.SUBCOMMANDS, "report", report)
    assert main(["report", "runs/x", "--not.a.config.key"], spawn=refuse_spawn) == 7
    assert seen == [["runs/x", "--not.a.config.key"]]


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (
            NonFiniteError("train step 3: the loss is nan; the step was refused"),
            "async-grpo: error: train step 3: the loss is nan; the step was refused; no "
            "checkpoint was written yet\n",
        ),
        (
            KeyError("x"),
            "async-grpo: error: KeyError: 'x' (in a spawned process); no checkpoint was "
            "written yet\n",
        ),
    ],
)
def test_a_run_failing_in_a_process_is_one_line(
    error: Exception,
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    async def fail(*args: object, **kwargs: object) -> Components:
        raise ActorError(error)  # what an actor's exception becomes in the controller

    assert main(["--preset", "tiny", "--out_dir", str(tmp_path)], spawn=fail) == 1
    assert capsys.readouterr().err == message


def help_text(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main([*args, "--help"], spawn=refuse_spawn) == 0
    return capsys.readouterr().out


def test_help_lists_each_field_with_its_docstring_and_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # One column of boxes (tyro uses two from 130 columns on), wide enough that no option's
    # help wraps: the checks below look for whole lines.
    monkeypatch.setenv("COLUMNS", "129")
    out = help_text([], capsys)
    assert "uv run async-grpo" in out  # the command's docstring: what it does, how to run it
    assert "Presets: tiny" in out
    assert "qwen2.5-0.5b" in out
    # Every key is listed in CLI syntax, with its docstring and the default preset's value.
    cfg = PRESETS[DEFAULT_PRESET]()
    lines = {
        "--trainer.lr FLOAT": f"Peak learning rate of AdamW. (default: {cfg.trainer.lr})",
        "--model.chat_template {true,false}": "Wrap each prompt in the tokenizer's chat template "
        f"(instruct models). (default: {str(cfg.model.chat_template).lower()})",
        "--trainer.advantage_scale {std,mean,none}": "What a group's centred rewards are "
        'divided by: "std" (GRPO)',
        "--buffer.max_policy_age INT": "Oldest policy version a trained episode may come from, "
        f"in versions behind (async mode). (default: {cfg.buffer.max_policy_age})",
        "--trainer.loss.kl_coef FLOAT": "Weight of the k3 KL to the reference model in the "
        f"loss; 0 turns it off. (default: {cfg.trainer.loss.kl_coef})",
        "--steps INT": f"Train steps (each one policy version). (default: {cfg.steps})",
        "--model STR, --model.path STR": "Local checkpoint directory or hub id",
    }
    for flag, meaning in lines.items():
        assert flag in out, flag
        assert meaning in out, meaning
    assert "\x1b[" not in out  # plain text when not on a terminal


def test_help_shows_the_chosen_presets_values(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "129")
    out = help_text(["--preset", "qwen2.5-0.5b"], capsys)
    assert f"(default: {qwen25_05b().trainer.lr})" in out
    assert "The defaults below are qwen2.5-0.5b's." in out
