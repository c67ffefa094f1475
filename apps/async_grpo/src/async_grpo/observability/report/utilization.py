"""How busy each component was, computed from a run's trace (pure functions, no plotting).

A process is busy while any of its non-wait spans is open (overlapping spans count once).
A component's busy share in a window is the mean, over its processes, of the busy time
inside the window divided by the window's length; two generator replicas each busy half
the time make a generator share of 0.5. The controller orchestrates and is not a
component here: its spans are mostly the time it waits for the others.

The steady state, over which a run's single busy shares are given, runs from the end of the
trainer's first span to the end of its last (start-up and the first fill of the buffer are
excluded, as in the rates of `metrics.StepRow`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

from async_grpo.tracing.files import SpanEvent, Trace

NOT_COMPONENTS = frozenset({"controller"})

Interval = tuple[float, float]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering exactly the same time as `intervals`."""
    out: list[Interval] = []
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def covered(intervals: Sequence[Interval], t0: float, t1: float) -> float:
    """Seconds of [t0, t1] inside the disjoint `intervals`."""
    return sum(max(0.0, min(e, t1) - max(s, t0)) for s, e in intervals)


def busy_intervals(spans: Iterable[SpanEvent]) -> dict[str, list[Interval]]:
    """Per process: the union of its non-wait spans."""
    per: dict[str, list[Interval]] = {}
    for s in spans:
        if not s.wait:
            per.setdefault(s.process, []).append((s.start_s, s.end_s))
    return {p: union(iv) for p, iv in per.items()}


def component_kinds(trace: Trace) -> list[str]:
    """The component kinds that recorded spans, in the trace's process order."""
    seen = {s.kind for s in trace.spans}
    kinds: list[str] = []
    for p in trace.processes:
        if p.kind in seen and p.kind not in kinds and p.kind not in NOT_COMPONENTS:
            kinds.append(p.kind)
    kinds += sorted(k for k in seen - set(kinds) if k not in NOT_COMPONENTS)
    return kinds


def steady_window(trace: Trace) -> Interval:
    """(start, end) seconds of the steady state; the whole trace when the trainer left no
    span. Checkpoint spans do not extend it: the run's last checkpoint follows its last
    step."""
    trainer = [
        s for s in trace.spans if s.kind == "trainer" and not s.wait and s.name != "checkpoint"
    ]
    if len(trainer) >= 2:
        ends = sorted(s.end_s for s in trainer)
        return ends[0], ends[-1]
    start = min((s.start_s for s in trace.spans), default=0.0)
    return start, trace.end_s


@dataclasses.dataclass(frozen=True)
class Utilization:
    """A component's busy share over time: `share[i]` for the window starting at
    `starts[i]` seconds (each `window_s` long), and `overall` over the steady state.
    `processes` counts the processes averaged."""

    kind: str
    window_s: float
    starts: tuple[float, ...]
    share: tuple[float, ...]
    overall: float
    processes: int


def pick_window(length_s: float, windows: int = 60) -> float:
    """A round window length giving about `windows` windows over `length_s` seconds."""
    raw = max(length_s / windows, 1e-3)
    step = 10.0 ** math.floor(math.log10(raw))
    return min((m * step for m in (1, 2, 5, 10) if m * step >= raw), default=10 * step)


def utilization(trace: Trace, window_s: float | None = None) -> dict[str, Utilization]:
    """Every component's busy share per window (from the first span of a component, so
    that start-up, which records nothing, is left out) and over the steady state, by kind."""
    busy = busy_intervals(trace.spans)
    t_end = trace.end_s
    t0 = min((s.start_s for s in trace.spans if s.kind not in NOT_COMPONENTS), default=0.0)
    window = window_s or pick_window(t_end - t0)
    count = max(1, math.ceil((t_end - t0) / window))
    starts = tuple(t0 + i * window for i in range(count))
    s0, s1 = steady_window(trace)
    out: dict[str, Utilization] = {}
    for kind in component_kinds(trace):
        procs = sorted({s.process for s in trace.spans if s.kind == kind})
        series = [busy.get(p, []) for p in procs]
        share = tuple(
            sum(covered(iv, t, t + window) for iv in series) / (window * len(procs)) for t in starts
        )
        steady = sum(covered(iv, s0, s1) for iv in series) / max(1e-9, (s1 - s0) * len(procs))
        out[kind] = Utilization(kind, window, starts, share, min(1.0, steady), len(procs))
    return out


def excerpt_window(trace: Trace, steps: int = 12, bounds: Interval = (0.5, 20.0)) -> Interval:
    """A stretch in the middle of the steady state about `steps` trainer steps long (within
    `bounds` seconds), for a readable timeline."""
    s0, s1 = steady_window(trace)
    trainer = [s for s in trace.spans if s.kind == "trainer" and not s.wait]
    period = (s1 - s0) / max(1, len(trainer) - 1) if trainer else (s1 - s0) / steps
    length = min(max(steps * period, bounds[0]), bounds[1], s1 - s0)
    mid = (s0 + s1) / 2
    return mid - length / 2, mid + length / 2


def in_window(spans: Iterable[SpanEvent], window: Interval) -> list[SpanEvent]:
    """The spans overlapping `window`."""
    t0, t1 = window
    return [s for s in spans if s.end_s > t0 and s.start_s < t1]
