"""`async-grpo report RUN_DIR`: one self-contained HTML page about a run, or about a sweep.

The page (`RUN_DIR/report.html`) carries plotly.js inline, so it opens offline: the reward
and evaluation curves, staleness and throughput from `metrics.jsonl`, and, from
`trace.json`, the busy share of every component per time window and a timeline of the
steady state. For a sweep directory (`sweep.json`, written by `async-grpo sweep`) the page
holds every run and a slider moves between them: the timeline, the utilization, the figures
and the numbers (busy shares, episodes/s, staleness, final reward) all change with it.

A run that was cut short (killed, interrupted, or its files torn) gets a report of what is
there with a banner saying so; a directory with no run in it is an error.
"""

from __future__ import annotations

import argparse
import html
import json
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import plotly.io  # type: ignore[import-untyped]
import plotly.offline  # type: ignore[import-untyped]

from async_grpo.observability.report import figures as figs
from async_grpo.observability.report.page import PAGE
from async_grpo.observability.report.run_dir import ReportError, RunData, load_run, run_cycles
from async_grpo.observability.report.utilization import excerpt_window, steady_window, utilization


def summarize(run: RunData) -> dict[str, float | None]:
    """The numbers the page shows for a run (None where the run has no data for one):
    steady-state busy shares, trained episodes/s at the last step, where the generated
    episodes went (trained, dropped as too stale, filtered / dropped / lost, held), mean
    staleness over the steps, the mean batch cycle and train step (`cycle.py`; a prompts
    run with a trace, a known bound and its batches trained at it), the final windowed
    reward and evaluation."""
    rows, last = run.rows, (run.rows[-1] if run.rows else {})
    util = utilization(run.trace) if run.trace is not None else {}
    stale = [float(r["staleness_mean"]) for r in rows if r.get("staleness_mean") is not None]
    generated = last.get("episodes_generated")
    cycles = run_cycles(run)
    stats = {
        "max_policy_age": run.max_policy_age,
        "episodes_per_s": last.get("episodes_per_s"),
        "trained_share": _ratio(last.get("episodes_trained"), generated),
        "stale_share": _ratio(last.get("episodes_stale"), generated),
        "other_share": _ratio(
            sum(float(last.get(f"episodes_{k}", 0) or 0) for k in ("filtered", "dropped", "lost")),
            generated,
        ),
        "held_share": _ratio(last.get("episodes_held"), generated),
        "generator_busy": util["generator"].overall if "generator" in util else None,
        "trainer_busy": util["trainer"].overall if "trainer" in util else None,
        "staleness_mean": sum(stale) / len(stale) if stale else None,
        "cycle_ms": cycles.cycle_ms if cycles is not None else None,
        "train_ms": cycles.train_ms if cycles is not None else None,
        "reward_final": last.get("reward_window"),
        "eval_final": last.get("eval_reward"),
        "steps": last.get("version"),
    }
    return {k: _finite(v) for k, v in stats.items()}


def _ratio(num: object, den: object) -> float | None:
    a, b = _finite(num), _finite(den)
    return a / b if a is not None and b else None


def _finite(value: object) -> float | None:
    """A finite number as float; anything else (missing, NaN, not a number) as None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


FORMATS = {
    "max_policy_age": "{:.0f}",
    "episodes_per_s": "{:.1f}",
    "trained_share": "{:.0%}",
    "stale_share": "{:.0%}",
    "other_share": "{:.0%}",
    "held_share": "{:.0%}",
    "generator_busy": "{:.0%}",
    "trainer_busy": "{:.0%}",
    "staleness_mean": "{:.2f}",
    "cycle_ms": "{:.1f} ms",
    "train_ms": "{:.1f} ms",
    "reward_final": "{:.3f}",
    "eval_final": "{:.3f}",
    "steps": "{:.0f}",
}


def _fig_json(fig: Any) -> Any:
    return json.loads(plotly.io.to_json(fig, validate=False))


def run_view(run: RunData, label: str, colours: dict[str, str]) -> dict[str, Any]:
    """Everything the page draws for one run, as JSON-ready data."""
    stats = summarize(run)
    out_figs: dict[str, Any] = {}
    if run.trace is not None:
        util = utilization(run.trace)
        trace_figs = {
            "timeline": figs.timeline_figure(run.trace, excerpt_window(run.trace), colours),
            "utilization": figs.utilization_figure(util, steady_window(run.trace)),
        }
        out_figs.update({k: _fig_json(v) for k, v in trace_figs.items()})
    if run.rows:
        row_figs = {
            "reward": figs.reward_figure(run.rows),
            "throughput": figs.throughput_figure(run.rows),
            "staleness": figs.staleness_figure(run.rows),
        }
        out_figs.update({k: _fig_json(v) for k, v in row_figs.items()})
    return {
        "label": label,
        "dir": str(run.run_dir),
        "stats": {
            k: {"value": v, "text": "–" if v is None else FORMATS[k].format(v)}
            for k, v in stats.items()
        },
        "figs": out_figs,
        "cut_short": run.cut_short,
        "notes": list(run.notes),
    }


def render(runs: Sequence[RunData], labels: Sequence[str], title: str) -> str:
    """The whole page for `runs` (a slider between them when there are several)."""
    colours = figs.span_colours([r.trace for r in runs if r.trace is not None])
    views = [run_view(r, label, colours) for r, label in zip(runs, labels, strict=True)]
    if len(runs) > 1:
        stats = [summarize(r) for r in runs]
        for k, view in enumerate(views):
            view["figs"]["tradeoff"] = _fig_json(figs.tradeoff_figure(labels, stats, k))
    fill = {
        "TITLE": html.escape(title),
        "PLOTLYJS": plotly.offline.get_plotlyjs(),
        "DATA": json.dumps({"title": title, "runs": views}).replace("</", "<\\/"),
    }
    # One pass, so nothing inserted (plotly.js, the data) is searched for placeholders.
    return re.sub(r"%(TITLE|PLOTLYJS|DATA)%", lambda m: fill[m.group(1)], PAGE)


def _label(run: RunData, fallback: str) -> str:
    age = run.max_policy_age
    if age is None:
        return fallback
    return f"max_policy_age {age}" + (" (sync)" if age == 0 else "")


def write_report(run_dir: Path, out: Path | None = None) -> Path:
    """Writes `report.html` for a run directory, or for a sweep directory (one with
    `sweep.json`); returns its path."""
    run_dir = Path(run_dir)
    manifest = run_dir / "sweep.json"
    if manifest.exists():
        entries = json.loads(manifest.read_text()).get("runs")
        if not isinstance(entries, list) or not entries:
            raise ReportError(f'{manifest}: expected {{"runs": [{{"dir": ...}}, ...]}}, no runs')
        runs = [load_run(run_dir / e["dir"], e.get("max_policy_age")) for e in entries]
        labels = [_label(r, e["dir"]) for r, e in zip(runs, entries, strict=True)]
        title = f"Sweep: {len(runs)} runs from sync to async"
    else:
        runs = [load_run(run_dir)]
        labels = [_label(runs[0], run_dir.name)]
        title = f"Run report: {run_dir.name}"
    out = out or run_dir / "report.html"
    out.write_text(render(runs, labels, title), encoding="utf-8")
    return out


def main(argv: list[str]) -> int:
    """`async-grpo report RUN_DIR [--out FILE]`: writes the report of a run or a sweep.
    Exit status 0, or 2 with one line on stderr when there is nothing to report."""
    parser = argparse.ArgumentParser(
        prog="async-grpo report",
        description="Writes RUN_DIR/report.html: one offline page with the run's curves and "
        "the utilization of every component from its trace (a slider for a sweep directory).",
    )
    parser.add_argument("run_dir", type=Path, help="the out_dir of a run, or of a sweep")
    parser.add_argument("--out", type=Path, default=None, help="default: RUN_DIR/report.html")
    args = parser.parse_args(argv)
    try:
        out = write_report(args.run_dir, args.out)
    except (ReportError, OSError, ValueError, KeyError) as e:
        print(f"async-grpo report: error: {e}", file=sys.stderr)
        return 2
    print(f"report: {out}")
    return 0
