"""Bad multi-turn settings are refused before anything is written or spawned."""

from __future__ import annotations

from pathlib import Path

import pytest
from async_grpo.config.args import apply_overrides
from async_grpo.config.presets import pattern
from async_grpo.config.schema import ConfigError
from async_grpo.launch.prepare import prepare


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"env.tasks": "chess"}, "unknown environment 'chess'; known: calculator, pattern, repeat"),
        ({"env.tasks": "pattern:-2"}, "the weight of 'pattern' must be finite and >= 0"),
        (
            {"env.tasks": "pattern", "env.level": "9"},
            "env.level 9 is above the top level of 'pattern' (4)",
        ),
        ({"env.tasks": "pattern", "data.path": "x.jsonl"}, "env.tasks and a dataset"),
        ({"env.step_timeout_s": "0"}, "env.step_timeout_s must be > 0"),
        ({"env.max_turns": "0"}, "env.max_turns must be >= 1"),
        ({"env.curriculum": "1.5"}, "env.curriculum must be in [0, 1]"),
        ({"eval_prompts": "65"}, "eval_prompts (65) is more than the 64 held-out tasks of"),
        ({"buffer.warmup_episodes": "5000"}, "buffer.warmup_episodes (5000) must be <="),
    ],
)
def test_bad_env_input_is_refused_before_anything_is_written(
    tmp_path: Path, overrides: dict[str, str], problem: str
) -> None:
    out = tmp_path / "run"
    cfg = apply_overrides(pattern(), {"out_dir": str(out), **overrides})
    with pytest.raises(ConfigError) as e:
        prepare(cfg)
    assert problem in str(e.value)
    assert not out.exists()
