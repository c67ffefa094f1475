"""Ctrl-C (SIGINT) on `async-grpo` stops every process the app started, after a checkpoint,
and names the process that sent it; a controller that crashes prints its Python stacks and
takes every process it started with it."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from async_grpo.checkpoint import disk
from async_grpo.checkpoint.disk import verify

pytestmark = pytest.mark.slow  # a whole run (or a whole set of processes)


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`, from /proc (Linux)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def start_run(out: Path, *python: str) -> subprocess.Popen[str]:
    """`async-grpo --preset tiny` (started with `python` options) for far more steps than a
    test waits for, a line a step, stdout and stderr piped together."""
    cmd = [sys.executable, *python, "--preset", "tiny", "--steps", "100000", "--log_every", "1"]
    return subprocess.Popen(
        [*cmd, "--out_dir", str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def wait_for_line(proc: subprocess.Popen[str], prefix: str, within_s: float = 240) -> None:
    """Reads `proc`'s output up to a line starting with `prefix`."""
    assert proc.stdout is not None
    deadline = time.monotonic() + within_s
    for line in proc.stdout:
        if line.startswith(prefix):
            return
        assert time.monotonic() < deadline, f"no line {prefix!r} within {within_s:g} s"
    raise AssertionError(f"the run ended before a line {prefix!r}")


def test_sigint_stops_every_process(tmp_path: Path) -> None:
    # A test runner started in the background (`cmd &`) ignores SIGINT, and an ignored signal
    # stays ignored in its children: the run gets Python's Ctrl-C handler back first.
    restore = (
        "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "runpy.run_module('async_grpo.cli', run_name='__main__', alter_sys=True)"
    )
    proc = start_run(tmp_path, "-c", restore)
    try:
        wait_for_line(proc, "step")
        children = descendants(proc.pid)
        assert len(children) >= 5  # dataset, buffer, trainer, 2 generators, reward, ...
        # Sent by a process of its own, which stays a moment, as a shell's `kill` would.
        send = "import os, signal, sys, time; os.kill(int(sys.argv[1]), signal.SIGINT); "
        send += "time.sleep(5)"
        sender = subprocess.Popen([sys.executable, "-c", send, str(proc.pid)])
        out, _ = proc.communicate(timeout=120)
        sender.wait()
        assert proc.returncode == 130, out[-2000:]
        assert "interrupted; every process was stopped" in out
        # Who sent it, when it arrived and in the summary.
        named = f"SIGINT from pid {sender.pid} ({sys.executable} -c {send} {proc.pid})"
        assert f"[{named}: ending after this step with a checkpoint" in out, out[-2000:]
        assert f"stopped early by {named}" in out
        deadline = time.monotonic() + 30
        while any(alive(p) for p in children) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not [p for p in children if alive(p)]
        # The step it stopped after is checkpointed, whole (`--resume` would continue it).
        newest = disk.complete(tmp_path)[-1]
        verify(newest)
        assert "--resume" in out
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_controller_that_crashes_says_where_and_leaves_no_process(tmp_path: Path) -> None:
    # SIGABRT, as a native library's failed check ends a process: the controller prints every
    # thread's Python stack before it dies, and every process it started ends with it.
    proc = start_run(tmp_path, "-m", "async_grpo.cli")
    try:
        wait_for_line(proc, "step    5")
        started = descendants(proc.pid)
        assert started, "the run started no process"
        os.kill(proc.pid, signal.SIGABRT)
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGABRT, rest[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Fatal Python error: Aborted" in rest, rest[-2000:]
    assert "(most recent call first)" in rest, rest[-2000:]
    assert "run_watched" in rest, rest[-2000:]  # the main thread, waiting on the run's thread
    deadline = time.monotonic() + 60
    while [p for p in started if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [p for p in started if alive(p)], "processes outlived their controller"
