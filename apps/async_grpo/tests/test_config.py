"""Config overrides and validation: bad input is an error naming the key, nothing applied."""

import re

import pytest
from async_grpo.config import ConfigError, RunConfig, apply_overrides, validate
from async_grpo.presets import PRESETS, tiny


def test_overrides_set_typed_values_on_a_copy() -> None:
    base = tiny()
    cfg = apply_overrides(
        base,
        {"trainer.lr": "5e-4", "sampling.group_size": "4", "mode": "sync",
         "trainer.scale_by_std": "false", "model.path": "/x"},
    )  # fmt: skip
    assert cfg.trainer.lr == 5e-4
    assert cfg.sampling.group_size == 4
    assert cfg.mode == "sync"
    assert cfg.trainer.scale_by_std is False
    assert cfg.model.path == "/x"
    assert base.trainer.lr == tiny().trainer.lr  # the preset is untouched
    assert base.mode == "async"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("trainer.lrr", "1", "unknown config key 'trainer.lrr' (did you mean 'trainer.lr'?)"),
        ("sampling.groupsize", "1", "(did you mean 'sampling.group_size'?)"),
        ("nosuch.lr", "1", "unknown config key 'nosuch.lr'"),
        ("trainer", "1", "unknown config key 'trainer'"),
        ("steps.x", "1", "unknown config key 'steps.x'"),
        ("trainer.lr", "fast", "trainer.lr: expected float, got 'fast'"),
        ("sampling.group_size", "2.5", "sampling.group_size: expected int"),
        ("mode", "both", "mode: 'both' is not one of"),
        ("trainer.scale_by_std", "maybe", "expected true or false"),
    ],
)
def test_bad_override_names_the_key_and_applies_nothing(key: str, value: str, message: str) -> None:
    base = tiny()
    with pytest.raises(ConfigError, match=re.escape(message)):
        apply_overrides(base, {"trainer.lr": "0.5", key: value})
    assert base.trainer.lr == tiny().trainer.lr


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("sampling.group_size", "1", "group_size must be >= 2"),
        ("trainer.lr", "0", "lr must be > 0"),
        ("trainer.lr", "-1e-3", "lr must be > 0"),
        ("buffer.max_policy_age", "-1", "max_policy_age must be >= 0"),
        ("trainer.batch_size", "100", "multiple of sampling.group_size"),
        ("sampling.top_p", "0", "top_p"),
    ],
)
def test_validate_rejects_out_of_range(key: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate(apply_overrides(tiny(), {key: value}))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_valid(name: str) -> None:
    cfg = PRESETS[name]()
    assert isinstance(cfg, RunConfig)
    validate(cfg)
