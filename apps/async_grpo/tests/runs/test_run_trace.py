"""A real run's trace: every component kind records well-formed spans into trace.json, the
report's trainer busy share agrees with the trainer idle time the run measured itself, and
`--trace false` records nothing.

Real Monarch processes: two generator replicas, the reward service, the dataset, the
buffer, the reference model (the KL term is on) and a trainer sharded over two ranks.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import pytest
from async_grpo.config.args import apply_overrides
from async_grpo.config.presets import tiny
from async_grpo.launch.prepare import prepare
from async_grpo.observability.report.build import load_run, summarize, write_report
from async_grpo.tracing.files import load_trace
from async_grpo.train import run
from synthetic_runs import assert_well_formed

pytestmark = pytest.mark.slow  # a whole run (or a whole set of processes)

KINDS = {"controller", "dataset", "generator", "reward", "buffer", "reference", "trainer"}


def test_every_component_is_traced(tmp_path: Path) -> None:
    steps = 8
    overrides = {
        "steps": str(steps),
        "out_dir": str(tmp_path),
        "generator.replicas": "2",
        "trainer.procs": "2",
        "trainer.loss.kl_coef": "0.05",
        "eval_every": "0",
    }
    cfg = apply_overrides(tiny(), overrides)
    summary = asyncio.run(run(cfg, prepare(cfg), quiet=True))
    assert summary.steps == steps
    data = assert_well_formed(tmp_path / "trace.json")
    assert data["otherData"]["cut_short"] is False
    trace = load_trace(tmp_path / "trace.json")
    assert all(p.complete and p.status == "ok" for p in trace.processes), trace.processes
    assert {p.kind for p in trace.processes} == KINDS
    names = sorted(p.name for p in trace.processes if p.kind in ("generator", "trainer"))
    assert names == ["generator 0", "generator 1", "trainer 0", "trainer 1"]
    spans = Counter((s.kind, s.name) for s in trace.spans)
    for key in [
        ("generator", "generate"),
        ("generator", "update_weights"),
        ("reward", "score"),
        ("dataset", "sample"),
        ("buffer", "put"),
        ("buffer", "wait_for_room"),
        ("buffer", "sample_wait"),
        ("reference", "logprobs"),
        ("controller", "episode"),
        ("controller", "sync"),
    ]:
        assert spans[key] > 0, key
    # Each rank records each step and its publish.
    assert spans[("trainer", "train_step")] == 2 * steps
    assert spans[("trainer", "publish")] == 2 * steps
    steps_seen = sorted(
        s.args["version"]
        for s in trace.spans
        if s.process == "trainer 1" and s.name == "train_step"
    )
    assert steps_seen == list(range(1, steps + 1))
    pulls = [s for s in trace.spans if s.name == "update_weights"]
    assert all(s.args["bytes"] > 0 for s in pulls)
    # Two measurements of one thing: the trace's trainer busy share and the run's own
    # trainer idle time (both from the end of the first step).
    last = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    stats = summarize(load_run(tmp_path))
    assert stats["trainer_busy"] is not None
    assert abs(stats["trainer_busy"] - (1 - last["trainer_idle_frac"])) < 0.1, stats
    assert write_report(tmp_path).exists()
