"""Where the time goes between a version and the train step that learns from it: the batch
cycle, read from a run's trace (pure functions, no plotting).

With staleness bound `a` (`max_policy_age`; 0 in sync mode), the episodes sampled on the
weights of version v are trained by the step that makes version v + a + 1 at the latest,
and in the steady state at exactly that step: the rollouts cannot start them before v
exists. The cycle C is the time from the end of the train step that makes v to the start
of the step that makes v + a + 1; that step's own duration is T. Over those a + 1 steps
the trainer's clock advances by C + T, so over a run, exactly,

    mean step period = (mean C + mean T) / (a + 1).

Sync mode (a = 0) pays the whole cycle every step; async at bound 1 shares it between two
steps, which is why it can approach, never pass, twice the speed of sync: what keeps it
below is the cycle and the step growing when the rollouts and the trainer share the cores.
`batch_cycles` splits C into the segments below (they add up to C, cycle by cycle) for
the first generation call on each version's weights. A stage that began before the one it
follows ended (a request already on its way when the step's answer came) overlapped it:
its segment reads 0 for that cycle.

The split assumes every batch is trained at the bound, as the steady state at bounds 0 and
1 is (mean staleness 0.00 and 1.00). Where batches are trained younger than the bound (a
bound the rollouts cannot keep ahead of), the step that makes v + a + 1 trains newer
episodes, and the time v's episodes wait in the buffer would read as hand-over: callers
check `trained_at_bound` first.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import statistics
from collections.abc import Sequence

from async_grpo.tracing.files import SpanEvent, Trace

SEGMENTS = (
    ("step answered", "the trainer's answer reaches the controller"),
    ("request sent", "the controller records the step and sends the generation request"),
    ("request to sampling", "the request reaches the generator, which pulls the weights"),
    ("sampling", "the generator samples the call's responses"),
    ("answer back", "the responses reach the controller"),
    ("reward", "scored by the reward service"),
    ("into the buffer", "advantages computed, the groups put into the replay buffer"),
    ("trainer busy", "the batch is ready; the trainer still runs the step before"),
    ("hand-over", "the buffer's batch reaches the trainer, which starts the step"),
)
"""The cycle's segments in order: (name, what happens in it)."""


@dataclasses.dataclass(frozen=True)
class Cycles:
    """The batch cycles of a trace's steady state at staleness bound `age`: the mean
    milliseconds of each of `SEGMENTS` (`segments_ms`, in that order; they add up to
    `cycle_ms`), the mean cycle C and train step T in ms over the `count` cycles found, and
    the mean step period in ms over the same steps (`period_ms`: the trainer's clock from
    the first cycle's start to the last one's step end, over the steps in between)."""

    age: int
    count: int
    segments_ms: tuple[float, ...]
    cycle_ms: float
    train_ms: float
    period_ms: float


def batch_cycles(trace: Trace, age: int, skip: int = 0) -> Cycles | None:
    """The cycles of the versions after the first `skip` train steps, the first cycle of a
    version whose spans are all in the trace (a prompts run: `generate`, `reward` and `put`
    spans in the controller's rollout lanes); None when there is none (an environments run,
    or too few steps)."""
    steps_run = _named(trace, "trainer", "train_step")
    rank0 = min((s.process for s in steps_run), default="")  # a sharded trainer's ranks agree
    trained = {_version(s): s for s in steps_run if s.process == rank0}
    answered = {_version(s): s for s in _named(trace, "controller", "train_step")}
    sampled: dict[int, SpanEvent] = {}
    for s in _named(trace, "generator", "generate"):
        sampled.setdefault(_version(s), s)  # the first call on each version's weights
    requests = _Lanes(_named(trace, "controller", "generate"))
    rewards = _Lanes(_named(trace, "controller", "reward"))
    puts = _Lanes(_named(trace, "controller", "put"))
    stored = _Lanes(_named(trace, "buffer", "put"))
    rows: list[tuple[float, ...]] = []
    firsts: list[float] = []
    lasts: list[float] = []
    steps = sorted(trained)[skip:]
    for v in steps:
        made, learns = trained.get(v), trained.get(v + age + 1)
        before = trained.get(v + age)
        if made is None or learns is None or before is None or v not in answered:
            continue
        sample = sampled.get(v)
        request = requests.served(sample) if sample is not None else None
        if sample is None or request is None:
            continue
        reward = rewards.next(request.lane, request.end_s)
        put = puts.next(request.lane, reward.end_s) if reward is not None else None
        store = stored.handled(put) if put is not None else None
        if reward is None or store is None:
            continue
        ready = store.end_s
        free = max(ready, before.end_s)  # the trainer can take the batch from here
        marks = _forward(
            made.end_s,
            answered[v].end_s,
            request.start_s,
            sample.start_s,
            sample.end_s,
            request.end_s,
            reward.end_s,
            ready,
            free,
            learns.start_s,
        )
        rows.append((*(b - a for a, b in itertools.pairwise(marks)), learns.end_s - learns.start_s))
        firsts.append(made.end_s)
        lasts.append(learns.end_s)
    if not rows:
        return None
    means = [statistics.fmean(col) * 1e3 for col in zip(*rows, strict=True)]
    segments, train = tuple(means[:-1]), means[-1]
    # The trainer's clock over the steps these cycles cover, one period a step.
    first = min(firsts)
    last = max(lasts)
    covered = [v for v in steps if trained[v].end_s > first and trained[v].end_s <= last]
    period = (last - first) / max(1, len(covered)) * 1e3
    return Cycles(age, len(rows), segments, sum(segments), train, period)


def trained_at_bound(staleness: Sequence[float], age: int, tolerance: float = 0.05) -> bool:
    """Whether the steps whose mean staleness (versions) is `staleness` trained their batches
    at the bound `age`, on average within `tolerance`: what `batch_cycles` assumes."""
    return bool(staleness) and statistics.fmean(staleness) >= age - tolerance


def _forward(*marks: float) -> tuple[float, ...]:
    """`marks` moved forward in time where one comes before the mark it follows, and none
    past the last. A stage that began before the previous one ended (on a loaded machine
    the trainer publishes v, a request already on its way pulls it and samples on v before
    the trainer's answer reaches the controller) overlapped it and adds nothing to the
    cycle: its segment reads 0, the next one counts from the later mark, and the segments
    still add up to the cycle."""
    out = [marks[0]]
    for mark in marks[1:-1]:
        out.append(min(max(mark, out[-1]), marks[-1]))
    return (*out, marks[-1])


def _named(trace: Trace, kind: str, name: str) -> list[SpanEvent]:
    return [s for s in trace.spans if s.kind == kind and s.name == name]


def _version(span: SpanEvent) -> int:
    return int(span.args.get("version", -1))


class _Lanes:
    """Spans of one name, by lane, each lane in start order. The tracer opens a span on a
    lane only once the lane's last top-level span has closed, so two spans of one name on
    one lane never overlap: each lookup is a binary search per lane, and a report on a long
    run stays linear in its steps."""

    def __init__(self, spans: Sequence[SpanEvent]) -> None:
        self._lanes: dict[str, list[SpanEvent]] = {}
        for s in sorted(spans, key=lambda s: s.start_s):
            self._lanes.setdefault(s.lane, []).append(s)
        self._starts = {lane: [s.start_s for s in v] for lane, v in self._lanes.items()}

    def next(self, lane: str, after: float) -> SpanEvent | None:
        """The first span on `lane` starting at or after `after` seconds."""
        spans, starts = self._lanes.get(lane, []), self._starts.get(lane, [])
        at = bisect.bisect_left(starts, after)
        return spans[at] if at < len(spans) else None

    def served(self, inner: SpanEvent) -> SpanEvent | None:
        """The span (a request) that `inner` (its handling) answered: of the requests open
        across all of `inner`, one a lane at most, the first to end (a request queued
        behind it ends after its own, later handling)."""
        holding = []
        for lane, spans in self._lanes.items():
            at = bisect.bisect_right(self._starts[lane], inner.start_s) - 1
            if at >= 0 and inner.end_s <= spans[at].end_s:
                holding.append(spans[at])
        return min(holding, key=lambda o: o.end_s, default=None)

    def handled(self, outer: SpanEvent) -> SpanEvent | None:
        """The span (the handling of a request) inside `outer` (the request): the first to
        start, when another rollout lane's request was handled meanwhile too."""
        inside = []
        for lane, spans in self._lanes.items():
            at = bisect.bisect_left(self._starts[lane], outer.start_s)
            if at < len(spans) and spans[at].end_s <= outer.end_s:
                inside.append(spans[at])
        return min(inside, key=lambda i: i.start_s, default=None)
