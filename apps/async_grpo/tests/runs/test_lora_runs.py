"""Whole runs with LoRA adapters (`--trainer.lora.rank 4`), real Monarch processes: every
step's weight sync moves the adapter's bytes alone, and a sync run with a fixed seed repeats
bit for bit (per-step losses, rewards, prompts trained, the adapters and their AdamW state)
when its controller is SIGKILLed and the run resumed with `--resume`, and when, in that
resumed run, its trainer is SIGKILLed and restored from the last checkpoint.

A small model (`conftest.TEST_ARCH`), 6 sync steps with a checkpoint every 2.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from async_grpo.config.args import apply_overrides
from async_grpo.config.presets import tiny
from async_grpo.config.schema import LoraConfig, RunConfig
from async_grpo.model.lora import adapter_state, add_adapters
from async_grpo.model.policy import load_policy
from exact_runs import (
    KILL_AT,
    STEPS,
    assert_same_state,
    assert_trainer_restored,
    final_state,
    kill_at_step,
    resume_killing_the_trainer,
    run_left_alone,
    sync_options,
    trained,
)
from jobs import rows

pytestmark = pytest.mark.slow  # whole runs


def options(out: Path, model: Path) -> dict[str, str]:
    """The fault-tolerance tests' sync run, training rank-4 adapters."""
    return {**sync_options(out, model), "trainer.lr": "3e-3", "trainer.lora.rank": "4"}


def config(out: Path, model: Path) -> RunConfig:
    return apply_overrides(tiny(), options(out, model))


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path) -> Path:
    """The LoRA run left alone."""
    return run_left_alone(tmp_path_factory, "clean-lora", options(Path(), tiny_checkpoint))


def test_every_sync_moves_the_adapter_alone(clean: Path, tiny_checkpoint: Path) -> None:
    adapter = adapter_state(add_adapters(load_policy(str(tiny_checkpoint)), LoraConfig(rank=4)))
    adapter_bytes = sum(t.numel() * t.element_size() for t in adapter.values())
    whole = load_policy(str(tiny_checkpoint)).state_dict()
    assert [r["weight_sync_bytes"] for r in rows(clean)] == [adapter_bytes] * STEPS
    assert adapter_bytes < sum(t.numel() * t.element_size() for t in whole.values()) / 4
    weights = final_state(clean)["model"]
    assert weights
    assert all(".lora_A." in n or ".lora_B." in n for n in weights)
    # On-policy in sync mode: sampled by the weights that trained on them.
    assert all(r["staleness_mean"] == 0 for r in rows(clean))


def test_a_sigkilled_lora_run_resumes_exactly_and_so_does_its_killed_trainer(
    clean: Path, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    # As in test_fault_tolerance.py: the whole run SIGKILLed at step 5, then the resumed
    # run's trainer SIGKILLed when step 5 is recorded again; both repeat the run left alone.
    kill_at_step(options(tmp_path, tiny_checkpoint), tmp_path, KILL_AT)
    assert len(rows(tmp_path)) == KILL_AT
    lines: list[str] = []
    resume_killing_the_trainer(tmp_path, KILL_AT, lines)
    assert_trainer_restored(lines, tmp_path, KILL_AT)
    assert rows(tmp_path)[-1]["resumes"] == 1
    assert trained(tmp_path) == trained(clean)
    assert_same_state(final_state(tmp_path), final_state(clean))
