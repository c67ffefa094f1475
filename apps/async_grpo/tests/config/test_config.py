"""Config overrides and validation: bad input is an error naming the key, nothing applied."""

import re

import pytest
from async_grpo.config.args import apply_overrides, parse, take_flag
from async_grpo.config.presets import ARCHS, PRESETS, tiny
from async_grpo.config.schema import ConfigError, LossConfig, RunConfig
from async_grpo.config.validate import validate


def test_overrides_set_typed_values_on_a_copy() -> None:
    base = tiny()
    cfg = apply_overrides(
        base,
        {"trainer.lr": "5e-4", "sampling.group_size": "4", "mode": "sync",
         "model.chat_template": "true", "trainer.advantage_scale": "mean", "model.path": "/x"},
    )  # fmt: skip
    assert cfg.trainer.lr == 5e-4
    assert cfg.sampling.group_size == 4
    assert cfg.mode == "sync"
    assert cfg.model.chat_template is True
    assert cfg.trainer.advantage_scale == "mean"
    assert cfg.model.path == "/x"
    assert base.trainer.lr == tiny().trainer.lr  # the preset is untouched
    assert base.mode == "async"
    assert cfg.trainer is not base.trainer  # a copy, not a view of the preset


def test_nested_loss_config_is_set_through_the_trainer() -> None:
    base = tiny()
    cfg = apply_overrides(
        base, {"trainer.loss.kl_coef": "0.05", "trainer.loss.importance": "truncate"}
    )
    assert isinstance(cfg.trainer.loss, LossConfig)
    assert (cfg.trainer.loss.kl_coef, cfg.trainer.loss.importance) == (0.05, "truncate")
    # The other loss fields keep the preset's values.
    assert cfg.trainer.loss.entropy_coef == base.trainer.loss.entropy_coef == 0.1
    assert base.trainer.loss.kl_coef == 0.0


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("trainer.lrr", "1", "unknown config key 'trainer.lrr' (did you mean 'trainer.lr'?)"),
        ("sampling.groupsize", "1", "(did you mean 'sampling.group_size'?)"),
        # The loss fields moved under trainer.loss: the old key points to the new one.
        ("trainer.kl_coef", "0.1", "(did you mean 'trainer.loss.kl_coef'?)"),
        ("nosuch.lr", "1", "unknown config key 'nosuch.lr'"),
        ("trainer", "1", "unknown config key 'trainer'"),
        ("steps.x", "1", "unknown config key 'steps.x'"),
        ("trainer.lr", "fast", "trainer.lr: expected float, got 'fast'"),
        ("sampling.group_size", "2.5", "sampling.group_size: expected int"),
        ("mode", "both", "mode: 'both' is not one of"),
        ("model.dtype", "fp16", "model.dtype: 'fp16' is not one of ['float32', 'bfloat16']"),
        ("model.chat_template", "maybe", "expected true or false"),
        ("trainer.advantage_scale", "max", "trainer.advantage_scale: 'max' is not one of"),
    ],
)
def test_bad_override_names_the_key_and_applies_nothing(key: str, value: str, message: str) -> None:
    base = tiny()
    with pytest.raises(ConfigError, match=re.escape(message)):
        apply_overrides(base, {"trainer.lr": "0.5", key: value})
    assert base.trainer.lr == tiny().trainer.lr


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"sampling.group_size": "1"}, "group_size must be >= 2"),
        ({"trainer.lr": "0"}, "lr must be > 0"),
        ({"trainer.lr": "-1e-3"}, "lr must be > 0"),
        ({"trainer.lr": "nan"}, "trainer.lr must be > 0 and finite, got nan"),
        ({"buffer.max_policy_age": "-1"}, "max_policy_age must be >= 0"),
        ({"nice": "20"}, "nice must be in 0..19 (a Linux nice value), got 20"),
        ({"nice": "-5"}, "nice must be in 0..19"),
        ({"trainer.batch_size": "100"}, "multiple of sampling.group_size"),
        ({"sampling.top_p": "0"}, "top_p"),
        ({"sampling.top_p": "2"}, "sampling.top_p must be in (0, 1], got 2.0"),
        ({"env.turn_discount": "1.5"}, "env.turn_discount must be in [0, 1], got 1.5"),
        ({"env.credit": "token"}, "env.credit: 'token' is not one of ['episode', 'turn']"),
        ({"steps": "0"}, "steps must be >= 1, got 0"),
        ({"log_every": "0"}, "log_every must be >= 1"),
        ({"trainer.procs": "0"}, "trainer.procs must be >= 1, got 0"),
        ({"trainer.loss.kl_coef": "-1"}, "trainer.loss.kl_coef must be >= 0"),
        ({"data.min_n": "5", "data.max_n": "3"}, "data.max_n (3) must be >= data.min_n (5)"),
        ({"data.path": "a.jsonl", "data.hf_name": "b"}, "data.path and data.hf_name"),
        ({"buffer.capacity": "16"}, "buffer.capacity (16) must be >= trainer.batch_size (128)"),
        # The most basic problem is reported, not one it causes further on: 7 episodes are
        # not whole groups of 16 (rather than "too few groups for trainer.procs").
        (
            {"trainer.batch_size": "7"},
            "trainer.batch_size (7) must be a positive multiple of sampling.group_size (16)",
        ),
        ({"trainer.batch_size": "0"}, "trainer.batch_size must be >= 1, got 0"),
        ({"trainer.procs": "16"}, "trainer.procs (16) must be <= the groups per batch"),
    ],
)
def test_validate_rejects_out_of_range(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(apply_overrides(tiny(), overrides))


@pytest.mark.parametrize(("mode", "expected"), [("async", 3), ("sync", 0)])
def test_effective_max_policy_age(mode: str, expected: int) -> None:
    cfg = apply_overrides(tiny(), {"mode": mode, "buffer.max_policy_age": "3"})
    assert cfg.effective_max_policy_age == expected
    assert cfg.buffer.max_policy_age == 3  # the setting itself is kept


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_valid(name: str) -> None:
    cfg = PRESETS[name]()
    validate(cfg)
    assert cfg.model.arch in ARCHS  # --model.random_weights true can build it
    # Each call builds a fresh config: changing one run's config leaves the preset alone.
    cfg.trainer.lr = 123.0
    assert PRESETS[name]().trainer.lr != 123.0
    assert RunConfig().trainer.loss == LossConfig()  # the defaults nest grpo's own defaults


def test_take_flag_takes_every_spelling_and_the_last_counts() -> None:
    argv = ["--steps", "3", "--resume", "--out_dir=x", "--resume=a", "--resume", "b"]
    assert take_flag(argv, "--resume", bare="") == ("b", ["--steps", "3", "--out_dir=x"])
    assert take_flag(["--resume"], "--resume", bare="") == ("", [])
    assert take_flag(["--resume", "--steps", "3"], "--resume", bare="") == (
        "",
        ["--steps", "3"],
    )
    assert take_flag(["--steps", "3"], "--resume") == (None, ["--steps", "3"])
    with pytest.raises(ConfigError, match="--ages needs a value"):
        take_flag(["--ages", "--steps", "3"], "--ages")


@pytest.mark.parametrize(
    "args", [["--steps", "5"], ["--steps=5"], ["--trainer.lr", "1e-3", "--seed", "2"]]
)
def test_an_option_the_caller_sets_itself_is_refused_by_name(args: list[str]) -> None:
    # A benchmark's options after `--` (`async_vs_sync.py`, `chaos.py`): not its own.
    name = "--seed" if "--seed" in args else "--steps"
    with pytest.raises(ConfigError, match=f"^{name} is set by this script, not after --$"):
        parse(args, tiny(), reserved=("--steps", "--seed"))
    assert parse(["--trainer.lr", "1e-3"], tiny(), reserved=("--steps",)).trainer.lr == 1e-3
