"""A real run's trace: every component kind records well-formed spans into trace.json, and
the report's trainer busy share agrees with the trainer idle time the run measured itself.
The same run logs to W&B in its offline mode (`--metrics.wandb`): the run's W&B directory
holds every row of metrics.jsonl (read back from its `.wandb` file, no server), the config
and the report.

Real Monarch processes: two generator replicas, the reward service, the dataset, the
buffer, the reference model (the KL term is on) and a trainer sharded over two ranks.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest
from async_grpo.config.args import apply_overrides
from async_grpo.config.presets import tiny
from async_grpo.launch.prepare import prepare
from async_grpo.observability.report.build import summarize, write_report
from async_grpo.observability.report.cycle import SEGMENTS, batch_cycles
from async_grpo.observability.report.run_dir import load_run
from async_grpo.tracing.files import load_trace
from async_grpo.train import run
from jobs import rows
from synthetic_runs import assert_well_formed
from wandb_files import read_offline_run, run_dirs

pytestmark = pytest.mark.slow  # a whole run (or a whole set of processes)

KINDS = {"controller", "dataset", "generator", "reward", "buffer", "reference", "trainer"}


# Enough steps that one late message (~50 ms on a loaded 2-core machine) moves the two busy
# shares compared below by well under their tolerance: over 8 steps it moved them 0.13.
STEPS = 20
HAS_WANDB = importlib.util.find_spec("wandb") is not None


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run both tests read, logging to W&B offline when `wandb` is installed."""
    out = tmp_path_factory.mktemp("traced")
    overrides = {
        "steps": str(STEPS),
        "out_dir": str(out),
        "generator.replicas": "2",
        "trainer.procs": "2",
        "trainer.loss.kl_coef": "0.05",
        "eval_every": "0",
        "seed": "3",
    }
    if HAS_WANDB:
        overrides["metrics.wandb"] = "async-grpo-tests"
    cfg = apply_overrides(tiny(), overrides)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")  # nothing leaves the machine
        mp.delenv("WANDB_API_KEY", raising=False)
        summary = asyncio.run(run(cfg, prepare(cfg), quiet=True))
    assert summary.steps == STEPS
    return out


def test_every_component_is_traced(traced: Path, tmp_path: Path) -> None:
    steps = STEPS
    data = assert_well_formed(traced / "trace.json")
    assert data["otherData"]["cut_short"] is False
    trace = load_trace(traced / "trace.json")
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
    # A rank's step names the rows it ran: its share of the batch, identical ones merged.
    ran = [
        (s.args["rows"], s.args["episodes"])
        for s in trace.spans
        if s.process.startswith("trainer") and s.name == "train_step"
    ]
    assert len(ran) == 2 * steps
    assert all(0 < r <= n for r, n in ran), ran
    pulls = [s for s in trace.spans if s.name == "update_weights"]
    assert all(s.args["bytes"] > 0 for s in pulls)
    # Each row names the pull of the version last broadcast, timed inside a traced pull.
    longest = max(s.end_s - s.start_s for s in pulls)
    late = [r["weight_pull_s"] for r in rows(traced)[2:]]
    assert all(0 < p <= longest + 1e-3 for p in late), (late, longest)
    # Two measurements of one thing: the trace's trainer busy share and the run's own
    # trainer idle time (both from the end of the first step).
    last = json.loads((traced / "metrics.jsonl").read_text().splitlines()[-1])
    stats = summarize(load_run(traced))
    assert stats["trainer_busy"] is not None
    assert abs(stats["trainer_busy"] - (1 - last["trainer_idle_frac"])) < 0.1, stats
    assert write_report(traced, tmp_path / "report.html").exists()  # not the run's own


def test_the_batch_cycle_of_a_real_trace(traced: Path) -> None:
    """Every version's first call is found and split (two replicas, two trainer ranks, the
    reference model in the hand-over), and the cycle and step account for the period."""
    cycles = batch_cycles(load_trace(traced / "trace.json"), age=1, skip=2)
    assert cycles is not None
    assert cycles.count >= STEPS - 2 - 2 - 2, cycles  # not the skipped, nor the last two
    segments = dict(zip((name for name, _ in SEGMENTS), cycles.segments_ms, strict=True))
    assert segments["sampling"] > 0
    assert segments["hand-over"] > 0  # the reference model's log-probs come first
    # (C + T) / 2 is the period up to the two cycles at each end of so short a window.
    assert (cycles.cycle_ms + cycles.train_ms) / 2 == pytest.approx(cycles.period_ms, rel=0.2)


@pytest.mark.skipif(
    not HAS_WANDB,
    reason="needs the `wandb` package: uv sync --extra wandb (the nox session installs it)",
)
def test_an_offline_wandb_run_holds_the_rows_config_and_report(traced: Path) -> None:
    (run_dir,) = run_dirs(traced)
    logged = read_offline_run(run_dir)
    steps = [h for h in logged.history if "reward_window" in h]
    written = rows(traced)
    assert [h["version"] for h in steps] == [r["version"] for r in written]
    assert [r["version"] for r in written] == list(range(1, STEPS + 1))
    for key in ("reward_window", "loss", "grad_norm", "lr", "entropy", "episodes_trained"):
        assert [h[key] for h in steps] == pytest.approx([r[key] for r in written]), key
    assert logged.config["seed"] == 3
    assert logged.config["trainer"]["batch_size"] == tiny().trainer.batch_size
    assert logged.config["trainer"]["procs"] == 2
    # The report of the finished run (its trace included), as `async-grpo report` writes it.
    assert "Run report" in (traced / "report.html").read_text()
    (report,) = [h for h in logged.history if "report/path" in h]
    assert report["report/path"] in logged.files
