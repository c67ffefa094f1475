"""A generator replica SIGKILLed mid-run: the run goes on, says so in one line when the replica
dies and one when it is back, and counts both in the metrics."""

import asyncio
import os
import signal
from pathlib import Path

import pytest
from async_grpo.actors.trainer import TrainResult
from async_grpo.metrics import StepRow
from async_grpo.prepare import prepare
from async_grpo.presets import tiny
from jobs import keep_components, rows, run


@pytest.mark.timeout(300)
def test_a_killed_generator_is_reported_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tiny()
    cfg.steps, cfg.eval_every, cfg.out_dir = 20, 0, str(tmp_path)
    started = keep_components(monkeypatch)
    killed: list[int] = []

    def on_step(row: StepRow, result: TrainResult) -> None:
        del result
        if row.version == 5:
            (pid,) = started[0].generator.status().replicas[0].pids
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    lines: list[str] = []
    asyncio.run(run(cfg, prepare(cfg), on_step, lines.append))

    assert killed
    got = rows(tmp_path)
    # The trainer needs fresh episodes for every step after the kill, so the run could only
    # finish with the replica back.
    assert got[-1]["version"] == 20
    assert got[-1]["replica_deaths"] == 1
    assert got[-1]["replica_restarts"] == 1
    assert all(r["replica_deaths"] == 0 for r in got if r["version"] <= 5)
    died = [x for x in lines if "generator replica 0 died" in x]
    back = [x for x in lines if "generator replica 0 is back after" in x]
    assert len(died) == 1, lines
    assert len(back) == 1, lines
    assert lines.index(died[0]) < lines.index(back[0])
