"""Span recording (`tracing`) and merging (`trace_files`): one clock for every process,
well-formed lanes, real Monarch processes, and what a kill leaves behind."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import cloudpickle  # type: ignore[import-untyped]
import pytest
from async_grpo import tracing
from async_grpo.tracing.files import Trace, TraceError, load_trace, merge
from monarch.actor import Actor, endpoint, this_host
from synthetic_runs import assert_well_formed


class Worker(Actor):
    """A component stand-in: starts tracing the way the app's actors do, records spans."""

    def __init__(self) -> None:
        tracing.start_from_env("generator")

    @endpoint
    async def work(self, n: int) -> int:
        for i in range(n):
            with tracing.span("generate", version=i) as s:
                with tracing.span("decode"):
                    time.sleep(0.002)  # noqa: ASYNC251 - a stand-in for blocking compute
                s.set(tokens=8)
        return os.getpid()


cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_off_costs_nothing_and_writes_nothing(tmp_path: Path) -> None:
    tracing.stop()
    assert tracing.span("x") is tracing.NULL_SPAN
    with tracing.span("x", size=3) as s:
        s.set(more=1)
    tracing.counter("size", value=1.0)
    assert tracing.active() is None
    assert not list(tmp_path.iterdir())


async def test_concurrent_tasks_get_lanes_and_children_nest(tmp_path: Path) -> None:
    async def loop(k: int) -> None:
        for _ in range(3):
            with tracing.span("episode", track="rollout", loop=k):
                with tracing.span("generate", track="rollout"):
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.005)

    @tracing.traced("sync_helper")
    def helper() -> int:
        return 7

    with tracing.session(tmp_path) as tracer:
        assert tracer is not None
        assert os.environ[tracing.TRACE_ENV] == str(tmp_path / "trace")
        await asyncio.gather(loop(0), loop(1))
        assert helper() == 7
    assert tracing.TRACE_ENV not in os.environ
    data = assert_well_formed(tmp_path / "trace.json")
    threads = {e["args"]["name"] for e in data["traceEvents"] if e["name"] == "thread_name"}
    assert threads == {"rollout", "rollout 2", "main"}
    trace = load_trace(tmp_path / "trace.json")
    assert not trace.cut_short
    episodes = [s for s in trace.spans if s.name == "episode"]
    assert len(episodes) == 6
    assert {s.lane for s in episodes} == {"rollout", "rollout 2"}
    # Each child is inside an episode on its own lane.
    for child in (s for s in trace.spans if s.name == "generate"):
        assert any(
            p.lane == child.lane and p.start_s <= child.start_s and child.end_s <= p.end_s
            for p in episodes
        )


def test_error_in_session_marks_the_run_cut_short(tmp_path: Path) -> None:
    def interrupted_run() -> None:
        with tracing.session(tmp_path):
            with tracing.span("train_step"):
                pass
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        interrupted_run()
    trace = load_trace(tmp_path / "trace.json")
    assert trace.cut_short
    assert any("KeyboardInterrupt" in n for n in trace.notes)
    span = next(s for s in trace.spans if s.name == "train_step")
    assert span.args == {}


async def test_actor_processes_share_the_clock_and_close_cleanly(tmp_path: Path) -> None:
    """Spans of a real Monarch process land in the run's trace, between the controller's
    span that asked for them; the process closes its file when the mesh stops."""
    with tracing.session(tmp_path):
        procs = this_host().spawn_procs(per_host={"procs": 1})
        try:
            worker = procs.spawn("worker", Worker)
            with tracing.span("ask", track="rollout"):
                pid = await worker.work.call_one(5)
        finally:
            await procs.stop()
    trace = load_trace(tmp_path / "trace.json")
    assert_well_formed(tmp_path / "trace.json")
    gen = [s for s in trace.spans if s.kind == "generator"]
    assert [s.name for s in gen].count("generate") == 5
    assert [s.args.get("version") for s in gen if s.name == "generate"] == [0, 1, 2, 3, 4]
    assert all(s.args.get("tokens") == 8 for s in gen if s.name == "generate")
    ask = next(s for s in trace.spans if s.name == "ask")
    assert all(ask.start_s <= s.start_s and s.end_s <= ask.end_s for s in gen)
    info = {p.kind: p for p in trace.processes}
    assert info["generator"].os_pid == pid
    assert info["generator"].complete, "the stopped process did not write its footer"
    assert not trace.cut_short, trace.notes


KILLED = """
import sys, time
from pathlib import Path
from async_grpo import tracing
tracing.start(Path(sys.argv[1]), "trainer", index=0)
for i in range(20):
    with tracing.span("train_step", version=i):
        time.sleep(0.001)
time.sleep(1.5)  # the flush thread writes them
print("ready", flush=True)
with tracing.span("publish"):  # open, never written: the process dies inside it
    time.sleep(60)
"""


def test_a_killed_process_is_kept_and_marked(tmp_path: Path) -> None:
    trace_dir = tmp_path / "trace"
    with tracing.session(tmp_path):
        proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(KILLED), str(trace_dir)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        # A torn last line, as a kill in the middle of a write leaves it.
        with next(trace_dir.glob("trainer-*.jsonl")).open("a") as f:
            f.write('{"type": "X", "name": "train_s')
    trace = load_trace(tmp_path / "trace.json")
    steps = [s for s in trace.spans if s.name == "train_step"]
    assert len(steps) == 20
    assert not any(s.name == "publish" for s in trace.spans)
    trainer = next(p for p in trace.processes if p.kind == "trainer")
    assert (trainer.name, trainer.complete, trainer.status) == ("trainer 0", False, "cut short")
    assert not trace.cut_short  # the controller ended cleanly; the trainer's loss is noted
    assert any("trainer 0" in n and "without closing" in n for n in trace.notes)
    assert any("1 torn line" in n for n in trace.notes)
    data = json.loads((tmp_path / "trace.json").read_text())
    marks = [e for e in data["traceEvents"] if e["name"] == "trace cut short"]
    assert len(marks) == 1
    assert marks[0]["ts"] >= max(s.end_s for s in steps) * 1e6 - 1


def _torn(path: Path, keep: float) -> None:
    text = path.read_text()
    path.write_text(text[: int(len(text) * keep)])


def test_a_torn_trace_json_yields_its_complete_events(tmp_path: Path) -> None:
    with tracing.session(tmp_path):
        for i in range(200):
            with tracing.span("step", version=i):
                pass
    whole = load_trace(tmp_path / "trace.json")
    _torn(tmp_path / "trace.json", 0.6)
    part = load_trace(tmp_path / "trace.json")
    assert part.cut_short
    assert not whole.cut_short
    assert 60 < len(part.spans) < 200
    assert part.spans == whole.spans[: len(part.spans)]
    assert any("torn" in n for n in part.notes)


def test_nothing_to_merge_or_load_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no trace files"):
        merge(tmp_path, tmp_path / "trace.json")
    (tmp_path / "junk.json").write_text('{"traceEvents": [{"ph": "M", "name": "x"}]}')
    with pytest.raises(TraceError, match="no complete span events"):
        load_trace(tmp_path / "junk.json")
    (tmp_path / "other.json").write_text('{"hello": 1}')
    with pytest.raises(TraceError, match="not a Chrome trace"):
        load_trace(tmp_path / "other.json")


def test_spans_from_threads_do_not_nest_across_threads(tmp_path: Path) -> None:
    import threading  # noqa: PLC0415

    def work() -> None:
        for _ in range(5):
            with tracing.span("io", track="pool"):
                time.sleep(0.002)

    with tracing.session(tmp_path), tracing.span("outer", track="pool"):
        threads = [threading.Thread(target=work) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert_well_formed(tmp_path / "trace.json")
    trace: Trace = load_trace(tmp_path / "trace.json")
    assert len({s.lane for s in trace.spans if s.name == "io"}) >= 2
