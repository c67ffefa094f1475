"""Where a stuck process is stuck, read from a py-spy dump."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from async_grpo.observability.stuck import (
    _py_spy_error,
    innermost_project_frame,
    process_state,
    record_stuck,
    stuck_line,
    where_stuck,
)

DUMP = """Process 16683: python -m monarch._src.actor.bootstrap_main
Python v3.11.7 (/usr/bin/python3.11)

Thread 16683 (idle): "MainThread"
    EpollSelector.select (/usr/lib/python3.11/selectors.py:468)
Thread 16743 (idle): "trace-flush"
    Event.wait (/usr/lib/python3.11/threading.py:629)
    Tracer._flush_loop (/w/apps/async_grpo/src/async_grpo/tracing/tracer.py:265)
Thread 16688 (idle): "monarch-actor-event-loop"
    Event.wait (/usr/lib/python3.11/threading.py:629)
    all_reduce (/venv/lib/python3.11/site-packages/torch/distributed/c10d.py:10)
    TrainerCore.step (/w/apps/async_grpo/src/async_grpo/grpo/step.py:140)
    Trainer.train_step (/w/apps/async_grpo/src/async_grpo/actors/trainer.py:119)
    _Actor.handle (/venv/lib/python3.11/site-packages/monarch/_src/actor/actor_mesh.py:1754)
"""


def test_the_endpoints_innermost_project_frame_not_a_background_thread() -> None:
    # The flush thread waits as it always does; the endpoint's thread is the stuck call.
    assert innermost_project_frame(DUMP) == "TrainerCore.step (async_grpo/grpo/step.py:140)"
    assert innermost_project_frame("Thread 1 (idle)\n    f (/usr/lib/x.py:1)\n") == ""


def test_a_real_process_is_dumped_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # py-spy comes with Monarch, beside this Python: found with no PATH (an environment
    # used without being activated).
    monkeypatch.setenv("PATH", str(tmp_path))
    # A process stuck in this project's code (a module of the app, as installed).
    code = "import threading, async_grpo.actors._test_hang as h\nh._hang_for_a_test()\n"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(3.0)  # let it import and block
        (report,) = record_stuck(tmp_path, "demo", [proc.pid])
    finally:
        proc.kill()
        proc.wait()
    assert report.path is not None, report.problem
    assert report.path.parent == tmp_path / "stuck"
    assert report.path.name.startswith(f"demo-{proc.pid}-")
    assert "_hang_for_a_test" in report.path.read_text()
    assert report.innermost.startswith("_hang_for_a_test (async_grpo/actors/_test_hang.py:")
    line = stuck_line("trainer", "train_step", 15, [report])
    assert line.startswith(f"[trainer stuck: no answer to `train_step` within 15 s; pid {proc.pid}")
    assert f"stack saved to {report.path}]" in line


def test_no_py_spy_is_said_not_hidden(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing to run there
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))  # nor beside it
    (report,) = record_stuck(tmp_path, "x", [os.getpid()])
    assert report.path is None
    assert report.where() == "no stack: py-spy is not installed"


def test_py_spys_own_message_not_the_backtrace_after_it() -> None:
    stderr = (
        "Error: Failed to get stack traces\n\nStack backtrace:\n"
        "   0: anyhow::error::<impl anyhow::Error>::msg\n   9: main\n"
    )
    assert _py_spy_error(stderr) == "Failed to get stack traces"
    assert _py_spy_error("something else went wrong\n") == "something else went wrong"
    assert _py_spy_error("") == "failed"


def test_every_rank_is_named_and_a_stopped_one_says_so(tmp_path: Path) -> None:
    # Two ranks of one trainer: one blocked in this project's code, the other stopped (as a
    # rank the others wait for in a collective). Both go into the one line.
    code = "import threading, async_grpo.actors._test_hang as h\nh._hang_for_a_test()\n"
    blocked = subprocess.Popen([sys.executable, "-c", code])
    stopped = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(3.0)  # let them import and block
        os.kill(stopped.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10  # a signal is delivered when it next runs
        while process_state(stopped.pid) != "stopped" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process_state(stopped.pid) == "stopped"
        reports = record_stuck(tmp_path, "trainer", [blocked.pid, stopped.pid])
    finally:
        for proc in (blocked, stopped):
            proc.kill()
            proc.wait()
    assert [r.state for r in reports] == ["sleeping", "stopped"]
    line = stuck_line("trainer", "train_step", 15, reports)
    assert line.startswith(
        f"[trainer stuck: no answer to `train_step` within 15 s; pid {blocked.pid} at "
        "_hang_for_a_test (async_grpo/actors/_test_hang.py:"
    ), line
    assert f"; pid {stopped.pid}, stopped" in line, line
    assert line.endswith(f"; stacks saved in {tmp_path / 'stuck'}]"), line
    # What the trainer's death then says: every rank; one process, only where it was.
    assert where_stuck(reports).startswith(f"pid {blocked.pid} at _hang_for_a_test (")
    assert f"; pid {stopped.pid}, stopped" in where_stuck(reports)
    assert where_stuck(reports[:1]).startswith("at _hang_for_a_test (")
    assert process_state(os.getpid()) == "running"
    assert process_state(blocked.pid) == ""  # gone
