"""A generator replica SIGKILLed mid-run: the run goes on, says so in one line when the replica
dies and one when it is back, and counts both in the metrics."""

import asyncio
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import async_grpo.loop
import pytest
from async_grpo.actors.trainer import TrainResult
from async_grpo.components import Components, spawn_components
from async_grpo.config import RunConfig
from async_grpo.loop import StepCallback
from async_grpo.metrics import MetricsSink, RunMetrics, StepRow
from async_grpo.prepare import Prepared, prepare
from async_grpo.presets import tiny


@pytest.mark.timeout(300)
def test_a_killed_generator_is_reported_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tiny()
    cfg.steps, cfg.eval_every, cfg.out_dir = 20, 0, str(tmp_path)
    started: list[Components] = []

    async def spawn_and_keep(*args: object) -> Components:
        c = await spawn_components(*args)  # type: ignore[arg-type]
        started.append(c)
        return c

    monkeypatch.setattr(async_grpo.loop, "spawn_components", spawn_and_keep)
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
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # The trainer needs fresh episodes for every step after the kill, so the run could only
    # finish with the replica back.
    assert rows[-1]["version"] == 20
    assert rows[-1]["replica_deaths"] == 1
    assert rows[-1]["replica_restarts"] == 1
    assert all(r["replica_deaths"] == 0 for r in rows if r["version"] <= 5)
    died = [x for x in lines if "generator replica 0 died" in x]
    back = [x for x in lines if "generator replica 0 is back after" in x]
    assert len(died) == 1, lines
    assert len(back) == 1, lines
    assert lines.index(died[0]) < lines.index(back[0])


async def run(
    cfg: RunConfig, prep: Prepared, on_step: StepCallback, log: Callable[[str], None]
) -> None:
    sink = MetricsSink(Path(cfg.out_dir))
    try:
        await async_grpo.loop.run_job(cfg, prep, sink, on_step, RunMetrics(cfg.window), log=log)
    finally:
        sink.close()
