"""Run directories built by hand, as a run of `async-grpo` writes them: metrics.jsonl rows
with every `StepRow` field, per-process trace files in the `tracing` format (merged into
trace.json unless asked not to), and config.json.

The schedule is known exactly, so tests can check the report's numbers against it. With
`max_policy_age == 0` (sync) each train step waits for the generator: per cycle the
generator generates for `gen_s`, then the trainer steps for `train_s` while the generator
idles, then the generator takes the new weights for `sync_s`. With `max_policy_age >= 1`
the generator generates back to back (taking weights between batches) and the trainer
steps back to back.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from async_grpo.observability.metrics import StepRow
from async_grpo.tracing.files import SpanEvent, Trace, merge

ORIGIN_US = 1_700_000_000_000_000.0  # any Unix time in microseconds


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Seconds per phase and the run's length in train steps."""

    gen_s: float = 0.10
    train_s: float = 0.08
    sync_s: float = 0.01
    steps: int = 40
    episodes_per_step: int = 64


class ProcessFile:
    """Writes one process's trace file line by line, in `tracing.Tracer`'s format."""

    def __init__(self, path: Path, kind: str, pid: int, index: int | None = None) -> None:
        self.path, self.lines = (
            path,
            [
                {
                    "type": "process",
                    "format": 1,
                    "kind": kind,
                    "index": index,
                    "pid": pid,
                    "host": "test",
                    "start_us": ORIGIN_US,
                }
            ],
        )
        self.lanes: dict[str, int] = {}

    def span(
        self,
        name: str,
        start_s: float,
        end_s: float,
        lane: str = "main",
        wait: bool = False,
        **args: Any,
    ) -> None:
        if lane not in self.lanes:
            self.lanes[lane] = len(self.lanes)
            self.lines.append({"type": "lane", "id": self.lanes[lane], "name": lane})
        event: dict[str, Any] = {
            "type": "X",
            "name": name,
            "cat": "wait" if wait else "busy",
            "lane": self.lanes[lane],
            "ts": ORIGIN_US + start_s * 1e6,
            "dur": (end_s - start_s) * 1e6,
        }
        if args:
            event["args"] = args
        self.lines.append(event)

    def write(self, closed: bool = True, status: str = "ok") -> None:
        lines = [*self.lines]
        if closed:
            lines.append({"type": "end", "status": status, "ts": ORIGIN_US})
        self.path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def step_row(**values: Any) -> dict[str, Any]:
    """A metrics.jsonl row: every `StepRow` field, from `values` or 0 (None where optional)."""
    row: dict[str, Any] = {}
    for f in dataclasses.fields(StepRow):
        row[f.name] = values.pop(f.name, None if "None" in str(f.type) else 0)
    assert not values, f"not StepRow fields: {sorted(values)}"
    return row


def write_run(
    run_dir: Path,
    max_policy_age: int,
    schedule: Schedule = Schedule(),
    *,
    merged: bool = True,
    final_reward: float = 0.9,
) -> Path:
    """Writes a complete run directory; returns it."""
    s = schedule
    trace_dir = run_dir / "trace"
    trace_dir.mkdir(parents=True)
    ctrl = ProcessFile(trace_dir / "controller-100.jsonl", "controller", 100)
    gen = ProcessFile(trace_dir / "generator-101.jsonl", "generator", 101)
    trainer = ProcessFile(trace_dir / "trainer-102.jsonl", "trainer", 102)
    buf = ProcessFile(trace_dir / "buffer-103.jsonl", "buffer", 103)
    reward = ProcessFile(trace_dir / "reward-104.jsonl", "reward", 104)
    t = 0.5  # start-up
    train_ends: list[float] = []
    if max_policy_age == 0:
        for step in range(s.steps):
            gen.span("generate", t, t + s.gen_s, version=step)
            reward.span("score", t + s.gen_s, t + s.gen_s + 0.002)
            buf.span("put", t + s.gen_s, t + s.gen_s + 0.001)
            buf.span("sample_wait", t, t + s.gen_s, lane="sample", wait=True)
            trainer.span("train_step", t + s.gen_s, t + s.gen_s + s.train_s, version=step + 1)
            ctrl.span("train", t + s.gen_s, t + s.gen_s + s.train_s, lane="train")
            t += s.gen_s + s.train_s
            train_ends.append(t)
            gen.span("update_weights", t, t + s.sync_s, version=step + 1, bytes=1000)
            t += s.sync_s
    else:
        g = t
        while g < t + s.gen_s + s.steps * s.train_s:
            gen.span("generate", g, g + s.gen_s)
            reward.span("score", g + s.gen_s, g + s.gen_s + 0.002)
            buf.span("put", g + s.gen_s, g + s.gen_s + 0.001)
            gen.span("update_weights", g + s.gen_s, g + s.gen_s + s.sync_s)
            g += s.gen_s + s.sync_s
        tt = t + s.gen_s
        for step in range(s.steps):
            trainer.span("train_step", tt, tt + s.train_s, version=step + 1)
            ctrl.span("train", tt, tt + s.train_s, lane="train")
            tt += s.train_s
            train_ends.append(tt)
    for f in (ctrl, gen, trainer, buf, reward):
        f.write()
    steady = train_ends[-1] - train_ends[0]
    eps = (s.steps - 1) * s.episodes_per_step / steady
    rows = [
        step_row(
            version=k + 1,
            wall_s=end,
            reward_window=final_reward * (k + 1) / s.steps,
            episodes_trained=(k + 1) * s.episodes_per_step,
            episodes_generated=(k + 1) * s.episodes_per_step * (3 if max_policy_age == 0 else 1),
            episodes_per_s=eps,
            tokens_per_s=eps * 6,
            weight_sync_s=s.sync_s,
            staleness_mean=0.5 * max_policy_age,
            eval_reward=final_reward if (k + 1) % 10 == 0 else None,
            eval_version=k + 1 if (k + 1) % 10 == 0 else None,
        )
        for k, end in enumerate(train_ends)
    ]
    run_dir.joinpath("metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {"mode": "async", "buffer": {"max_policy_age": max_policy_age, "capacity": 512}}
    run_dir.joinpath("config.json").write_text(json.dumps(config))
    if merged:
        merge(trace_dir, run_dir / "trace.json")
    return run_dir


def write_sweep(root: Path, ages: tuple[int, ...] = (0, 1, 2, 4)) -> Path:
    """A sweep directory as `async-grpo sweep` writes it: one run per age, and sweep.json."""
    root.mkdir(parents=True, exist_ok=True)
    for age in ages:
        write_run(root / f"age-{age}", age, final_reward=0.9 - 0.05 * age)
    manifest = {"runs": [{"dir": f"age-{a}", "max_policy_age": a} for a in ages]}
    root.joinpath("sweep.json").write_text(json.dumps(manifest))
    return root


def assert_well_formed(trace_json: Path) -> dict[str, Any]:
    """Chrome trace checks: every X event has the fields Perfetto needs, and on every
    (pid, tid) the spans nest or are disjoint, never overlapping partially."""
    data = json.loads(trace_json.read_text())
    events = data["traceEvents"]
    lanes: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for e in events:
        assert e["ph"] in ("X", "M", "C", "i"), e
        if e["ph"] == "X":
            assert {"name", "ts", "dur", "pid", "tid", "cat"} <= set(e), e
            assert e["dur"] >= 0, e
            assert e["ts"] >= 0, e
            lanes.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for lane, spans in lanes.items():
        stack: list[float] = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-3, f"partial overlap on {lane}"
            stack.append(end)
    return dict(data)


MS = 1e-3


def span(
    kind: str, name: str, start_ms: float, end_ms: float, lane: str = "main", **args: int
) -> SpanEvent:
    """A busy span of the one process of `kind`, in milliseconds."""
    return SpanEvent(kind, kind, lane, name, start_ms * MS, end_ms * MS, False, dict(args))


def cycle_trace(
    age: int, train_ms: float, put_end_ms: float, steps: int = 8, request_ms: float = 1.0
) -> Trace:
    """A merged trace for `observability/report/cycle.py`. Step k (making version k) runs
    from 10k to 10k + `train_ms`, its answer reaches the controller 0.5 ms later; the
    request for the call on version v's weights is sent `request_ms` after the step that
    made v ends, and its groups are in the buffer `put_end_ms` after that end. The
    trainer starts each step 10 ms after the last, so the period is 10 ms whatever the
    cycle."""
    spans: list[SpanEvent] = []
    for k in range(1, steps + 1):
        start = 10.0 * k
        spans.append(span("trainer", "train_step", start, start + train_ms, version=k))
        end = start + train_ms
        spans.append(
            span("controller", "train_step", start - 0.2, end + 0.5, lane="train", version=k)
        )
        if k + age + 1 > steps:
            continue
        spans += [
            # A request on the other lane, open across this call and answered after it: not
            # the request this call served.
            span("controller", "generate", end + 0.8, end + 30.0, lane="rollout 2"),
            span("controller", "generate", end + request_ms, end + 5.5, lane="rollout"),
            span("generator", "generate", end + 2.0, end + 5.0, version=k),
            span("controller", "reward", end + 5.5, end + 6.5, lane="rollout"),
            span("controller", "put", end + 6.5, put_end_ms + end + 0.5, lane="rollout"),
            span("buffer", "put", put_end_ms + end - 0.5, put_end_ms + end, lane="put"),
        ]
    spans.sort(key=lambda s: s.start_s)
    return Trace(tuple(spans), (), False, (), max(s.end_s for s in spans))
