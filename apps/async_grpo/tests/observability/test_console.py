"""The run's summary as printed: what it says when a threshold was reached at step 0, later,
or never."""

from __future__ import annotations

import dataclasses

import pytest
from async_grpo.observability.console import Summary, print_summary, stop_signal
from async_grpo.observability.metrics import RunMetrics


def summary(**changes: object) -> Summary:
    base = Summary(
        mode="async",
        steps=40,
        wall_s=12.0,
        reward_start=0.2,
        reward_end=0.95,
        exact_end=0.9,
        reached_09_step=30,
        reached_09_s=9.0,
        eval_start=0.1,
        eval_end=0.96,
        eval_per_prompt=(("count to 1:", 1.0), ("count to 2:", 0.92)),
        eval_reached_09_step=20,
        episodes_per_s=100.0,
        trainer_idle_frac=0.05,
        metrics=RunMetrics(64),
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def printed(s: Summary, capsys: pytest.CaptureFixture[str]) -> str:
    print_summary(s, 64, "runs/x/metrics.jsonl")
    return capsys.readouterr().out


def test_a_threshold_met_later_names_its_step(capsys: pytest.CaptureFixture[str]) -> None:
    out = printed(summary(), capsys)
    assert "reward >= 0.9: step 30 (9s)" in out
    assert ">= 0.9 first at step 20" in out


def test_the_initial_weights_meeting_it_is_step_0_not_never(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = printed(summary(eval_reached_09_step=0, reached_09_step=0, reached_09_s=0.4), capsys)
    assert ">= 0.9 first at step 0" in out
    assert "reward >= 0.9: step 0 (0s)" in out
    assert "not reached" not in out


def test_never_reached_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    out = printed(
        summary(eval_reached_09_step=None, reached_09_step=None, reached_09_s=None), capsys
    )
    assert "reward >= 0.9: not reached" in out
    assert ">= 0.9 not reached" in out


def test_a_stop_signal_is_named_with_its_sender() -> None:
    assert stop_signal(15, "pid 12 (kill 34)") == "SIGTERM from pid 12 (kill 34)"
    assert stop_signal(2, None) == "SIGINT (sender unknown)"
    assert stop_signal(1461153528, None) == "signal 1461153528 (sender unknown)"
