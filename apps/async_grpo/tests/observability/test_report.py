"""`report`: the page's numbers against run directories whose schedule is known exactly,
offline self-containment, the sweep page, and what a missing or cut-short run gives."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from async_grpo.observability.report.build import run_view, summarize, write_report
from async_grpo.observability.report.run_dir import ReportError, RunData, load_run
from async_grpo.observability.report.utilization import covered, pick_window, union, utilization
from async_grpo.tracing.files import load_trace
from synthetic_runs import ProcessFile, Schedule, cycle_trace, step_row, write_run, write_sweep

S = Schedule()
SYNC_GEN = (S.gen_s + S.sync_s) / (S.gen_s + S.train_s + S.sync_s)
SYNC_TRAIN = S.train_s / (S.gen_s + S.train_s + S.sync_s)


def page_data(html: str) -> dict[str, Any]:
    found = re.search(
        r'<script id="report-data" type="application/json">(.*?)</script>', html, re.S
    )
    assert found, "the page carries no data"
    data: dict[str, Any] = json.loads(found.group(1))
    return data


def test_union_and_windows() -> None:
    assert union([(3, 4), (0, 1), (0.5, 2), (2, 2.5), (5, 5)]) == [(0, 2.5), (3, 4)]
    assert covered([(0, 2.5), (3, 4)], 2, 3.5) == pytest.approx(1.0)
    assert pick_window(60) == 1.0
    assert pick_window(7) == 0.2
    assert pick_window(0) == 0.001


def test_sync_run_busy_shares_follow_the_schedule(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path / "sync", 0))
    stats = summarize(run)
    assert stats["generator_busy"] == pytest.approx(SYNC_GEN, abs=1e-6)
    assert stats["trainer_busy"] == pytest.approx(SYNC_TRAIN, abs=1e-6)
    assert stats["max_policy_age"] == 0
    assert stats["steps"] == S.steps
    assert stats["trained_share"] == pytest.approx(1 / 3)
    assert not run.cut_short
    assert run.trace is not None
    util = utilization(run.trace, window_s=S.gen_s + S.train_s + S.sync_s)
    assert set(util) == {"generator", "reward", "buffer", "trainer"}
    # Every whole cycle after start-up shows the same split.
    steady = [
        x
        for t, x in zip(util["trainer"].starts, util["trainer"].share, strict=True)
        if 1.0 < t < 5.0
    ]
    assert steady
    assert all(0.2 < x < 0.7 for x in steady)


def test_async_run_keeps_both_sides_busy(tmp_path: Path) -> None:
    stats = summarize(load_run(write_run(tmp_path / "async", 2)))
    assert stats["generator_busy"] == pytest.approx(1.0, abs=1e-6)
    assert stats["trainer_busy"] == pytest.approx(1.0, abs=1e-6)
    sync = summarize(load_run(write_run(tmp_path / "sync", 0)))
    assert stats["episodes_per_s"] is not None
    assert sync["episodes_per_s"] is not None
    assert stats["episodes_per_s"] > 2 * sync["episodes_per_s"]


def test_the_batch_cycle_and_step_are_in_the_numbers(tmp_path: Path) -> None:
    trace = cycle_trace(age=1, train_ms=6.0, put_end_ms=12.0)
    at_bound = tuple(step_row(version=k, staleness_mean=1.0) for k in range(1, 9))
    run = RunData(tmp_path, at_bound, trace, None, 1, False, ())
    stats = summarize(run)
    assert stats["cycle_ms"] == pytest.approx(14.0)  # test_cycle.py splits this one
    assert stats["train_ms"] == pytest.approx(6.0)
    assert run_view(run, "one", {})["stats"]["cycle_ms"]["text"] == "14.0 ms"
    # A run without a known bound, whose batches were younger than it, or whose trace holds
    # no rollout calls: no cycle.
    assert summarize(dataclasses.replace(run, max_policy_age=None))["cycle_ms"] is None
    younger = tuple(step_row(version=k, staleness_mean=0.5) for k in range(1, 9))
    assert summarize(dataclasses.replace(run, rows=younger))["cycle_ms"] is None
    assert summarize(load_run(write_run(tmp_path / "run", 1)))["cycle_ms"] is None


def test_report_is_one_offline_file(tmp_path: Path) -> None:
    out = write_report(write_run(tmp_path / "run", 1))
    assert out == tmp_path / "run" / "report.html"
    html = out.read_text()
    assert not re.search(r"<script[^>]+src=", html), "a script is loaded from elsewhere"
    assert not re.search(r"<link[^>]+href=", html)
    assert "Plotly" in html
    assert len(html) > 1_000_000
    data = page_data(html)
    (view,) = data["runs"]
    assert set(view["figs"]) == {"timeline", "utilization", "reward", "throughput", "staleness"}
    assert view["label"] == "max_policy_age 1"
    assert view["stats"]["trainer_busy"]["text"] == "100%"
    timeline = view["figs"]["timeline"]
    rows = {y for trace in timeline["data"] for y in trace["y"]}
    assert {"generator", "trainer", "reward"} <= rows
    assert not view["cut_short"]


def test_sweep_page_holds_every_run(tmp_path: Path) -> None:
    out = write_report(write_sweep(tmp_path / "sweep"))
    data = page_data(out.read_text())
    labels = [r["label"] for r in data["runs"]]
    assert labels == [
        "max_policy_age 0 (sync)",
        "max_policy_age 1",
        "max_policy_age 2",
        "max_policy_age 4",
    ]
    busy = [r["stats"]["generator_busy"]["value"] for r in data["runs"]]
    assert busy[0] == pytest.approx(SYNC_GEN, abs=1e-6)
    assert busy[3] == pytest.approx(1.0)
    assert all("tradeoff" in r["figs"] for r in data["runs"])
    rewards = [r["stats"]["reward_final"]["value"] for r in data["runs"]]
    assert rewards == sorted(rewards, reverse=True)


def test_no_run_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="no such directory"):
        write_report(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match="no run here"):
        write_report(tmp_path / "empty")
    assert not (tmp_path / "empty" / "report.html").exists()


def test_killed_run_reports_what_is_there(tmp_path: Path) -> None:
    """The controller was killed: no trace.json, its own file has no footer, and the last
    metrics line is torn. The report merges the parts and says the run was cut short."""
    run_dir = write_run(tmp_path / "killed", 1, merged=False)
    ctrl = run_dir / "trace" / "controller-100.jsonl"
    ctrl.write_text("".join(ctrl.read_text().splitlines(keepends=True)[:-1]))  # no footer
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"version": 41, "wall_')
    html = write_report(run_dir).read_text()
    assert (run_dir / "trace.json").exists()
    (view,) = page_data(html)["runs"]
    assert view["cut_short"]
    notes = " ".join(view["notes"])
    assert "trace.json was missing" in notes
    assert "controller" in notes
    assert "without closing" in notes
    assert "metrics.jsonl line 41 is torn" in notes
    assert view["stats"]["steps"]["value"] == S.steps


def test_a_torn_trace_json_still_reports(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "torn", 0)
    text = (run_dir / "trace.json").read_text()
    (run_dir / "trace.json").write_text(text[: len(text) // 2])
    run = load_run(run_dir)
    assert run.cut_short
    assert run.trace is not None
    assert run.trace.spans
    assert summarize(run)["generator_busy"] is not None


def test_trace_without_metrics_and_tracing_off(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", 0)
    (run_dir / "metrics.jsonl").unlink()
    run = load_run(run_dir)
    assert run.rows == ()
    assert "no metrics.jsonl" in " ".join(run.notes)
    assert summarize(run)["episodes_per_s"] is None
    (view,) = page_data(write_report(run_dir).read_text())["runs"]
    assert set(view["figs"]) == {"timeline", "utilization"}
    assert view["stats"]["episodes_per_s"]["text"] == "–"

    only_metrics = write_run(tmp_path / "untraced", 0)
    (only_metrics / "trace.json").unlink()
    for f in (only_metrics / "trace").iterdir():
        f.unlink()
    (view,) = page_data(write_report(only_metrics).read_text())["runs"]
    assert set(view["figs"]) == {"reward", "throughput", "staleness"}
    assert "tracing was off" in " ".join(view["notes"])


def test_a_replica_killed_mid_run_keeps_its_spans(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", 1, merged=False)
    extra = ProcessFile(run_dir / "trace" / "generator-105.jsonl", "generator", 105)
    extra.span("generate", 0.6, 0.7)
    extra.write(closed=False)
    write_report(run_dir)
    trace = load_trace(run_dir / "trace.json")
    names = sorted(p.name for p in trace.processes if p.kind == "generator")
    assert names == ["generator 0", "generator 1"]
    assert not trace.cut_short
    assert any("generator 1" in n for n in trace.notes)


def test_reading_a_run_needs_no_plotly() -> None:
    """The GPU machine has no plotly: what reads a run directory, and the async vs sync
    benchmark that runs there (`tools/gpu_check.sh`'s `async_vs_sync` part), import none."""
    bench = Path(__file__).resolve().parents[2] / "benchmarks" / "async_vs_sync.py"
    code = (
        "import runpy, sys\n"
        "sys.modules['plotly'] = None  # any import of it fails\n"
        "import async_grpo.observability.report.run_dir\n"
        "sys.argv = ['async_vs_sync.py', '--help']\n"
        f"runpy.run_path({str(bench)!r}, run_name='__main__')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "--device {auto,cuda,cpu}" in done.stdout


def test_a_process_that_crashed_or_hung_is_a_note_on_the_page(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", 1)
    (run_dir / "crashes").mkdir()
    (run_dir / "crashes" / "trainer-71.txt").write_text(
        "Fatal Python error: Aborted\n\nCurrent thread 0x1 (most recent call first):\n"
        '  File "/r/src/async_grpo/grpo/step.py", line 140 in step\n'
    )
    (run_dir / "crashes" / "generator-72.txt").write_text("")  # killed outright: nothing
    (run_dir / "stuck").mkdir()
    (run_dir / "stuck" / "generator-0-73-20261130-140023.txt").write_text(
        'Thread 73 (idle): "MainThread"\n'
        "    _hang_for_a_test (/r/src/async_grpo/actors/_test_hang.py:41)\n"
    )
    (view,) = page_data(write_report(run_dir).read_text())["runs"]
    assert view["notes"][-2:] == [
        "trainer-71 crashed in step (async_grpo/grpo/step.py:140) (Fatal Python error: "
        "Aborted): crashes/trainer-71.txt",
        "generator-0-73 was stuck at _hang_for_a_test (async_grpo/actors/_test_hang.py:41): "
        "stuck/generator-0-73-20261130-140023.txt",
    ]
