"""Where a stuck process is stuck, read from a py-spy dump."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from async_grpo.observability.stuck import innermost_project_frame, record_stuck, stuck_line

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
