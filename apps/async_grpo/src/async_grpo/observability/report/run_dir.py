"""What a run directory holds, read into one `RunData`: its metrics rows, its merged trace, its
config and staleness bound, and notes on what did not go as planned (a torn file, a process
that crashed or was stuck); and the run's batch cycle (`cycle.py`) from them.

Separate from the page (`build.py`) so that what only reads a run, such as
`benchmarks/async_vs_sync.py`, needs neither plotly nor the page: the GPU machine runs it
without plotly installed.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from async_grpo.observability.crashes import CRASH_DIR, read_crashes
from async_grpo.observability.report.cycle import Cycles, batch_cycles, trained_at_bound
from async_grpo.observability.stuck import STUCK_DIR, innermost_project_frame
from async_grpo.tracing.files import Trace, TraceError, load_trace, merge

Row = dict[str, Any]


class ReportError(ValueError):
    """The directory holds nothing a report can be made of."""


@dataclasses.dataclass(frozen=True)
class RunData:
    """What a run directory holds: the `metrics.jsonl` rows (dicts of `metrics.StepRow`
    fields, in step order; `version` numbers the steps), the merged trace (None when
    tracing was off), the run's `config.json` if it wrote one, its staleness bound (from
    the config or the sweep's manifest; sync mode counts as 0), and whether the run was cut
    short, with notes saying why or what is missing."""

    run_dir: Path
    rows: tuple[Row, ...]
    trace: Trace | None
    config: dict[str, Any] | None
    max_policy_age: int | None
    cut_short: bool
    notes: tuple[str, ...]


def _read_rows(path: Path, notes: list[str]) -> tuple[list[Row], bool]:
    rows: list[Row] = []
    torn = False
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            torn = True
            notes.append(f"metrics.jsonl line {i} is torn and was skipped")
            continue
        if not isinstance(row, dict) or not isinstance(row.get("version"), int):
            notes.append(f"metrics.jsonl line {i} is not a step row and was skipped")
            continue
        rows.append(row)
    return rows, torn


def load_run(run_dir: Path, max_policy_age: int | None = None) -> RunData:
    """Reads a run directory; merges `trace/` into `trace.json` when the run was killed before
    it could. `max_policy_age`: the run's bound when its directory does not say. Raises
    `ReportError` when there is no run in it."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: no such directory")
    metrics, trace_json, trace_dir = (run_dir / n for n in ("metrics.jsonl", "trace.json", "trace"))
    has_parts = trace_dir.is_dir() and any(trace_dir.glob("*.jsonl"))
    if not (metrics.exists() or trace_json.exists() or has_parts):
        raise ReportError(
            f"{run_dir}: no run here (no metrics.jsonl, trace.json or trace/); give the out_dir "
            "of a run of `async-grpo`, or a directory written by `async-grpo sweep`"
        )
    notes: list[str] = []
    rows, torn = _read_rows(metrics, notes) if metrics.exists() else ([], False)
    if not metrics.exists():
        notes.append("no metrics.jsonl: the run ended before its first train step")
    trace: Trace | None = None
    try:
        if trace_json.exists():
            trace = load_trace(trace_json)
        elif has_parts:
            notes.append("trace.json was missing (the run did not finish): merged from trace/")
            trace = merge(trace_dir, trace_json)
        else:
            notes.append("no trace recorded (tracing was off)")
    except TraceError as e:
        notes.append(f"the trace is unusable: {e}")
    if trace is not None:
        notes += trace.notes
    notes += failure_notes(run_dir)
    if not rows and trace is None:
        raise ReportError(f"{run_dir}: nothing to report: " + "; ".join(notes))
    config_path = run_dir / "config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else None
    cut = torn or (trace.cut_short if trace is not None else False)
    age = _configured_age(config)
    age = age if age is not None else max_policy_age
    return RunData(run_dir, tuple(rows), trace, config, age, cut, tuple(notes))


def failure_notes(run_dir: Path) -> list[str]:
    """A note for each process of the run that crashed (its stacks in `crashes/`) or was
    found stuck and replaced (its stack in `stuck/`), with where it was."""
    notes = [
        f"{r.path.stem} crashed in {r.where or 'a frame not found'} ({r.error}): "
        f"{CRASH_DIR}/{r.path.name}"
        for r in read_crashes(run_dir)
    ]
    for path in sorted((run_dir / STUCK_DIR).glob("*.txt")):
        where = innermost_project_frame(path.read_text(errors="replace"))
        label = path.stem.rsplit("-", 2)[0]  # `<component>-<pid>` of `...-<date>-<time>`
        notes.append(
            f"{label} was stuck at {where or 'a frame not found'}: {STUCK_DIR}/{path.name}"
        )
    return notes


def _configured_age(config: dict[str, Any] | None) -> int | None:
    if config is None:
        return None
    if config.get("mode") == "sync":
        return 0
    age = config.get("buffer", {}).get("max_policy_age")
    return int(age) if age is not None else None


def run_cycles(run: RunData) -> Cycles | None:
    """The run's batch cycle (`cycle.py`) over its steady state, the first tenth of its steps
    left out; None without a trace, without a known bound, or where its batches were not
    trained at the bound."""
    skip = len(run.rows) // 10
    stale = [
        float(r["staleness_mean"]) for r in run.rows[skip:] if r.get("staleness_mean") is not None
    ]
    age = run.max_policy_age
    if run.trace is None or age is None or not trained_at_bound(stale, age):
        return None
    return batch_cycles(run.trace, age, skip=skip)
