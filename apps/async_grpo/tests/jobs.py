"""Running a whole job in a test: the components it spawned kept for the test to reach
(kill a replica, read a pid), and its metrics written to `<out_dir>/metrics.jsonl`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import async_grpo.controller
import pytest
from async_grpo.config.schema import RunConfig
from async_grpo.controller.controller import StepCallback
from async_grpo.launch.prepare import Prepared
from async_grpo.launch.spawn import Components, spawn_components
from async_grpo.observability.metrics import RunMetrics
from async_grpo.observability.sink import MetricsSink


def keep_components(monkeypatch: pytest.MonkeyPatch) -> list[Components]:
    """The list every later `run_job` of this test appends its `Components` to."""
    started: list[Components] = []

    async def spawn_and_keep(*args: object) -> Components:
        c = await spawn_components(*args)  # type: ignore[arg-type]
        started.append(c)
        return c

    monkeypatch.setattr(async_grpo.controller, "spawn_components", spawn_and_keep)
    return started


async def run(
    cfg: RunConfig, prep: Prepared, on_step: StepCallback, log: Callable[[str], None]
) -> RunMetrics:
    """`controller.run_job`, its rows written to `<cfg.out_dir>/metrics.jsonl`."""
    sink = MetricsSink(Path(cfg.out_dir))
    metrics = RunMetrics(cfg.window)
    try:
        await async_grpo.controller.run_job(cfg, prep, sink, on_step, metrics, log=log)
    finally:
        sink.close()
    return metrics


def rows(out_dir: Path) -> list[dict[str, float]]:
    """The metrics.jsonl rows of a run."""
    return [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]
