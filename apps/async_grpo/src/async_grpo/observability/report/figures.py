"""The report's plotly figures, built from a run's metrics rows and its trace.

Each function returns a `plotly.graph_objects.Figure`; `build.py` serialises them and the page
draws them with plotly.js. Rows are the dicts of `metrics.jsonl` (`metrics.StepRow` fields);
a field a row lacks is left out of its curve rather than failing the report.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go  # type: ignore[import-untyped]
from plotly.subplots import make_subplots  # type: ignore[import-untyped]

from async_grpo.observability.report.utilization import Interval, Utilization, in_window
from async_grpo.tracing.files import SpanEvent, Trace

Row = dict[str, Any]
Figure = Any  # plotly ships no type information

PALETTE = (
    "#4C78A8",
    "#F58518",
    "#54A24B",
    "#E45756",
    "#72B7B2",
    "#B279A2",
    "#FF9DA6",
    "#9D755D",
    "#EECA3B",
    "#BAB0AC",
)
KIND_COLOURS = {
    "generator": "#4C78A8",
    "trainer": "#E45756",
    "reward": "#54A24B",
    "buffer": "#B279A2",
    "dataset": "#9D755D",
    "reference": "#72B7B2",
}
SPAN_COLOURS = {
    # generator and its controller-side calls: blues; trainer: reds; buffer: purples
    "generate": "#4C78A8",
    "update_weights": "#9ECAE9",
    "episode": "#C6DBEF",
    "train_step": "#E45756",
    "publish": "#8C2D04",
    "reference": "#FF9DA6",
    "logprobs": "#FF9DA6",
    "score": "#54A24B",
    "reward": "#54A24B",
    "sample": "#9D755D",
    "prompts": "#9D755D",
    "put": "#B279A2",
    "wait_for_room": "#B279A2",
    "sample_wait": "#7F7F7F",
    "wait_fresh": "#7F7F7F",
    "sync": "#F58518",
}
"""Colours of the spans the app records; other names get the next colour of `PALETTE`."""
FONT = {"family": "system-ui, sans-serif", "size": 12}


def _layout(fig: Figure, title: str, height: int = 300) -> Figure:
    """Title top left, legend in one row between the title and the plot."""
    fig.update_layout(
        title={"text": title, "x": 0.01, "y": 0.98, "yanchor": "top"},
        height=height,
        margin={"l": 60, "r": 20, "t": 70 if title else 50, "b": 45},
        font=FONT,
        template="plotly_white",
        legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "xanchor": "left", "x": 0},
    )
    return fig


def _series(rows: Sequence[Row], key: str) -> tuple[list[Any], list[Any]]:
    pairs = [(r["version"], r[key]) for r in rows if r.get(key) is not None]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def reward_figure(rows: Sequence[Row]) -> Figure:
    """Windowed training reward per step, and the evaluations of fixed prompts."""
    fig = go.Figure()
    x, y = _series(rows, "reward_window")
    fig.add_trace(go.Scatter(x=x, y=y, name="training reward (window)", mode="lines"))
    evals: dict[int, float] = {}
    for r in rows:
        if r.get("eval_version") is not None and r.get("eval_reward") is not None:
            evals[int(r["eval_version"])] = float(r["eval_reward"])
    if evals:
        fig.add_trace(
            go.Scatter(
                x=list(evals), y=list(evals.values()), name="evaluation", mode="lines+markers"
            )
        )
    fig.update_yaxes(range=[0, 1.05], title="reward")
    fig.update_xaxes(title="train step (policy version)")
    return _layout(fig, "Reward")


def staleness_figure(rows: Sequence[Row]) -> Figure:
    """Mean age, in policy versions, of the episodes each step trained on."""
    x, y = _series(rows, "staleness_mean")
    fig = go.Figure(go.Scatter(x=x, y=y, name="mean staleness", mode="lines"))
    fig.update_yaxes(title="versions behind", rangemode="tozero")
    fig.update_xaxes(title="train step")
    return _layout(fig, "Staleness of trained episodes")


def throughput_figure(rows: Sequence[Row]) -> Figure:
    """Trained episodes/s and generated tokens/s (since the first step) per step."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    x, y = _series(rows, "episodes_per_s")
    fig.add_trace(go.Scatter(x=x, y=y, name="trained episodes/s", mode="lines"))
    x, y = _series(rows, "tokens_per_s")
    fig.add_trace(
        go.Scatter(x=x, y=y, name="generated tokens/s", mode="lines", line={"dash": "dot"}),
        secondary_y=True,
    )
    fig.update_yaxes(title="episodes/s", rangemode="tozero", secondary_y=False)
    fig.update_yaxes(title="tokens/s", rangemode="tozero", secondary_y=True)
    fig.update_xaxes(title="train step")
    return _layout(fig, "Throughput")


def utilization_figure(util: dict[str, Utilization], steady: Interval) -> Figure:
    """Busy share per window of every component, over the run; the steady state shaded."""
    fig = go.Figure()
    for i, (kind, u) in enumerate(util.items()):
        colour = KIND_COLOURS.get(kind, PALETTE[i % len(PALETTE)])
        fig.add_trace(
            go.Scatter(
                x=[t + u.window_s / 2 for t in u.starts],
                y=list(u.share),
                name=f"{kind} ({u.overall:.0%} busy)",
                mode="lines",
                line={"color": colour, "shape": "hv"},
            )
        )
    fig.add_vrect(x0=steady[0], x1=steady[1], fillcolor="#888", opacity=0.08, line_width=0)
    fig.update_yaxes(range=[0, 1.02], tickformat=".0%", title="busy share")
    fig.update_xaxes(title="seconds since start")
    window = next(iter(util.values())).window_s if util else 0.0
    return _layout(fig, f"Utilization per component ({window:g} s windows; steady state shaded)")


def _top_level(spans: Sequence[SpanEvent]) -> list[SpanEvent]:
    """The spans not nested in an earlier span of the same lane."""
    out: list[SpanEvent] = []
    open_until: dict[tuple[str, str], float] = {}
    for s in spans:
        key = (s.process, s.lane)
        if s.end_s <= open_until.get(key, float("-inf")) + 1e-9:
            continue  # inside the previous top-level span (rounding: back to back is not)
        open_until[key] = s.end_s
        out.append(s)
    return out


def _row(s: SpanEvent) -> str:
    return s.process if s.lane == "main" else f"{s.process} · {s.lane}"


def timeline_figure(trace: Trace, window: Interval, colours: dict[str, str]) -> Figure:
    """The spans in `window` as a Gantt chart, one row per process lane (top-level spans;
    waits drawn faint)."""
    spans = _top_level(in_window(trace.spans, window))
    rows: list[str] = []
    for s in trace.spans:  # every lane of the run, in trace order, even if idle here
        if _row(s) not in rows:
            rows.append(_row(s))
    # The components first, the controller (which mostly waits on them) below.
    order = {
        p.name: i + (len(trace.processes) if p.kind == "controller" else 0)
        for i, p in enumerate(trace.processes)
    }
    rows.sort(key=lambda r: order.get(r.split(" · ")[0], 2 * len(order)))
    fig = go.Figure()
    for name in sorted({s.name for s in spans}):
        for wait in (False, True):
            group = [s for s in spans if s.name == name and s.wait == wait]
            if not group:
                continue
            fig.add_trace(
                go.Bar(
                    y=[_row(s) for s in group],
                    x=[s.end_s - s.start_s for s in group],
                    base=[s.start_s for s in group],
                    orientation="h",
                    name=name + (" (wait)" if wait else ""),
                    marker={"color": colours.get(name, "#999"), "opacity": 0.3 if wait else 0.9},
                    hovertext=[_hover(s) for s in group],
                    hoverinfo="text",
                )
            )
    fig.update_yaxes(categoryorder="array", categoryarray=rows[::-1], type="category")
    fig.update_xaxes(range=list(window), title="seconds since start")
    fig.update_layout(barmode="overlay", bargap=0.25)
    title = f"Timeline, {window[1] - window[0]:.1f} s from the steady state"
    return _layout(fig, title, height=120 + 28 * len(rows))


def _hover(s: SpanEvent) -> str:
    args = "<br>".join(f"{k}: {v}" for k, v in s.args.items())
    head = f"<b>{s.name}</b> ({s.process}) {1e3 * (s.end_s - s.start_s):.1f} ms"
    return head + (f"<br>{args}" if args else "")


def span_colours(traces: Sequence[Trace]) -> dict[str, str]:
    """One colour per span name, the same in every run of a report."""
    names = sorted({s.name for t in traces for s in t.spans} - set(SPAN_COLOURS))
    return {**SPAN_COLOURS, **{n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}}


def tradeoff_figure(
    labels: Sequence[str], stats: Sequence[dict[str, float | None]], selected: int
) -> Figure:
    """Across the runs of a sweep: throughput, busy shares and staleness/reward; the run
    the slider selects is marked."""
    fig = make_subplots(
        rows=1,
        cols=3,
        subplot_titles=(
            "trained episodes/s",
            "busy (steady state), episodes used",
            "staleness and final reward",
        ),
    )
    x = [label.removeprefix("max_policy_age ") for label in labels]

    def col(key: str) -> list[float | None]:
        return [s.get(key) for s in stats]

    fig.add_trace(
        go.Scatter(
            x=x,
            y=col("episodes_per_s"),
            name="episodes/s",
            mode="lines+markers",
            line={"color": "#333"},
        ),
        1,
        1,
    )
    for key, name, colour in (
        ("generator_busy", "generator busy", KIND_COLOURS["generator"]),
        ("trainer_busy", "trainer busy", KIND_COLOURS["trainer"]),
        ("trained_share", "generated episodes trained on", "#999"),
    ):
        fig.add_trace(
            go.Scatter(
                x=x,
                y=col(key),
                name=name,
                mode="lines+markers",
                line={"color": colour, "dash": "dash" if key == "trained_share" else "solid"},
            ),
            1,
            2,
        )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=col("staleness_mean"),
            name="mean staleness",
            mode="lines+markers",
            line={"color": "#F58518"},
        ),
        1,
        3,
    )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=col("reward_final"),
            name="final reward",
            mode="lines+markers",
            line={"color": "#54A24B", "dash": "dot"},
        ),
        1,
        3,
    )
    for c in (1, 2, 3):
        fig.add_vrect(
            x0=selected - 0.4,
            x1=selected + 0.4,
            fillcolor="#FFD54F",
            opacity=0.35,
            line_width=0,
            row=1,
            col=c,
        )
    fig.update_yaxes(rangemode="tozero")
    fig.update_yaxes(range=[0, 1.02], tickformat=".0%", row=1, col=2)
    fig.update_xaxes(title="max_policy_age", type="category")
    _layout(fig, "", height=340)
    fig.update_layout(legend={"y": -0.3, "yanchor": "top"}, margin={"t": 30, "b": 90})
    return fig
