"""The batch cycle (`observability/report/cycle.py`) on hand-made traces whose segments are
known: every step 10 ms apart, each version's call on fixed offsets."""

from __future__ import annotations

import pytest
from async_grpo.observability.report.cycle import (
    SEGMENTS,
    Cycles,
    batch_cycles,
    trained_at_bound,
)
from async_grpo.tracing.files import Trace
from synthetic_runs import cycle_trace as trace
from synthetic_runs import span


def segments(c: Cycles | None) -> dict[str, float]:
    assert c is not None
    return dict(zip((name for name, _ in SEGMENTS), c.segments_ms, strict=True))


def test_an_async_cycle_whose_batch_is_late_for_the_trainer() -> None:
    # Bound 1: the call on v's weights feeds step v + 2, which starts 20 - 6 = 14 ms after v.
    c = batch_cycles(trace(age=1, train_ms=6.0, put_end_ms=12.0), age=1)
    assert c is not None
    assert c.count == 6  # versions 1-6; step 8 is the last
    assert segments(c) == pytest.approx(
        {
            "step answered": 0.5,
            "request sent": 0.5,
            "request to sampling": 1.0,
            "sampling": 3.0,
            "answer back": 0.5,
            "reward": 1.0,
            "into the buffer": 12.0 - 6.5,
            "trainer busy": 0.0,  # step v + 1 ended 10 ms after v: before the batch was in
            "hand-over": 14.0 - 12.0,
        }
    )
    assert c.cycle_ms == pytest.approx(14.0)
    assert c.train_ms == pytest.approx(6.0)
    assert c.period_ms == pytest.approx(10.0)
    assert (c.cycle_ms + c.train_ms) / 2 == pytest.approx(c.period_ms)


def test_a_request_sent_before_the_step_was_answered_overlaps_it() -> None:
    # On a loaded machine a request already on its way can pull v and sample on it before
    # the trainer's answer reaches the controller: sent at 0.3 ms, answered at 0.5 ms.
    c = batch_cycles(trace(age=1, train_ms=6.0, put_end_ms=12.0, request_ms=0.3), age=1)
    assert c is not None
    got = segments(c)
    assert got["step answered"] == pytest.approx(0.5)
    assert got["request sent"] == 0.0  # not -0.2: it adds nothing to the cycle
    assert got["request to sampling"] == pytest.approx(2.0 - 0.5)
    assert sum(got.values()) == pytest.approx(c.cycle_ms)
    assert c.cycle_ms == pytest.approx(14.0)  # the cycle itself is unchanged


def test_a_batch_ready_before_the_trainer_is_free_counts_as_trainer_busy() -> None:
    # Steps of 9.5 ms: step v + 1 ends 10 ms after v, the batch is in at 8.
    c = batch_cycles(trace(age=1, train_ms=9.5, put_end_ms=8.0), age=1)
    assert c is not None
    got = segments(c)
    assert got["into the buffer"] == pytest.approx(1.5)
    assert got["trainer busy"] == pytest.approx(10.0 - 8.0)
    assert got["hand-over"] == pytest.approx(20.0 - 9.5 - 10.0)
    assert c.cycle_ms == pytest.approx(20.0 - 9.5)
    assert (c.cycle_ms + c.train_ms) / 2 == pytest.approx(c.period_ms)


def test_a_sync_cycle_feeds_the_next_step() -> None:
    c = batch_cycles(trace(age=0, train_ms=2.0, put_end_ms=7.5), age=0)
    assert c is not None
    assert c.count == 7
    assert c.cycle_ms == pytest.approx(10.0 - 2.0)
    assert segments(c)["trainer busy"] == 0.0
    assert segments(c)["hand-over"] == pytest.approx(0.5)
    assert c.cycle_ms + c.train_ms == pytest.approx(c.period_ms)


def test_skipped_steps_and_a_run_without_calls() -> None:
    c = batch_cycles(trace(age=1, train_ms=6.0, put_end_ms=12.0), age=1, skip=3)
    assert c is not None
    assert c.count == 3  # versions 4-6
    bare = Trace(
        tuple(span("trainer", "train_step", 10.0 * k, 10.0 * k + 5, version=k) for k in (1, 2, 3)),
        (),
        False,
        (),
        0.035,
    )
    assert batch_cycles(bare, age=1) is None


def test_batches_trained_at_the_bound() -> None:
    assert trained_at_bound([1.0, 1.0, 1.0], 1)
    assert trained_at_bound([1.0, 0.9, 1.0], 1, tolerance=0.05)  # mean 0.967
    assert not trained_at_bound([1.0, 0.8, 1.0], 1)  # mean 0.933: some batches younger
    assert trained_at_bound([0.0, 0.0], 0)
    assert not trained_at_bound([2.8, 2.9], 4)
    assert not trained_at_bound([], 0)
