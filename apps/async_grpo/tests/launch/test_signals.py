"""The stop-signal front: a SIGINT or SIGTERM arrives with the process that sent it.

Real signals from real processes: each test starts a fresh interpreter that installs the
front first (as the `async-grpo` command does), then a separate "killer" process sends it
the signal with `os.kill`; the interpreter reports the sender it was given, which must be
the killer's pid and command line. The front changes the whole process's signal mask, so
it is never installed in the test process itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from async_grpo.launch import signals

# Sends signal `argv[2]` to pid `argv[1]`, then stays a moment, as a real sender (a shell,
# a process manager) does.
KILLER = "import os, sys, time; os.kill(int(sys.argv[1]), int(sys.argv[2])); time.sleep(3)"


def killer(pid: int, signum: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", KILLER, str(pid), str(int(signum))])


def start(script: str) -> subprocess.Popen[str]:
    """A fresh interpreter running `script` after installing the front; it prints "ready"
    once it waits for signals."""
    code = "from async_grpo.launch import signals\nassert signals.install_front()\n"
    return subprocess.Popen(
        [sys.executable, "-c", code + textwrap.dedent(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line == "ready\n", line + proc.stdout.read()


def test_a_listening_loop_gets_each_signal_with_its_sender() -> None:
    # Threads started after the front (here plain ones; torch's and Monarch's in the app)
    # inherit the blocked signals, so the front receives every one.
    proc = start(
        """
        import asyncio, json, threading
        for _ in range(4):
            threading.Thread(target=threading.Event().wait, daemon=True).start()

        async def main():
            got = asyncio.Queue()
            stop = signals.listen(asyncio.get_running_loop(), lambda *a: got.put_nowait(a))
            print("ready", flush=True)
            for _ in range(2):
                signum, sender = await got.get()
                print(json.dumps([signum, sender.pid, sender.command, str(sender)]), flush=True)
            stop()

        asyncio.run(main())
        """
    )
    try:
        wait_ready(proc)
        assert proc.stdout is not None
        for signum in (signal.SIGTERM, signal.SIGINT):
            sender = killer(proc.pid, signum)
            got, pid, command, text = json.loads(proc.stdout.readline())
            assert (got, pid) == (signum, sender.pid)
            assert command.startswith(f"{sys.executable} -c "), command
            assert "os.kill(" in command, command
            assert text == f"pid {sender.pid} ({command})"
            sender.wait()
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()


def test_without_a_listener_a_signal_does_what_it_did() -> None:
    # SIGINT: KeyboardInterrupt in the main thread at once, even in a blocking sleep.
    # SIGTERM: the process ends by it.
    proc = start(
        """
        import time
        print("ready", flush=True)
        start = time.monotonic()
        try:
            time.sleep(60)
        except KeyboardInterrupt:
            print(f"KeyboardInterrupt {time.monotonic() - start:.1f}", flush=True)
        print("ready", flush=True)
        time.sleep(60)
        """
    )
    try:
        wait_ready(proc)
        assert proc.stdout is not None
        killer(proc.pid, signal.SIGINT).wait()
        word, seconds = proc.stdout.readline().split()
        assert word == "KeyboardInterrupt"
        assert float(seconds) < 10, seconds
        wait_ready(proc)
        killer(proc.pid, signal.SIGTERM).wait()
        assert proc.wait(timeout=30) == -signal.SIGTERM
    finally:
        proc.kill()


def test_a_run_names_the_sender_and_a_second_signal_stops_it_at_once() -> None:
    # The app's handling (`train._stop_on_signals`), with torch and Monarch imported after
    # the front as in the command: the first SIGTERM asks for a stop after the step and logs
    # who sent it; a second signal cancels the run.
    proc = start(
        """
        import asyncio
        from async_grpo.controller.context import StopRequest
        from async_grpo.train import _stop_on_signals

        async def main():
            stop = StopRequest()
            restore = _stop_on_signals(stop, lambda line: print(line, flush=True))
            try:
                print("ready", flush=True)
                await stop.event.wait()
                print(f"stop {stop.signal} {stop.sender}", flush=True)
                await asyncio.sleep(60)
            finally:
                restore()

        try:
            asyncio.run(main())
        except asyncio.CancelledError:
            print("cancelled", flush=True)
        """
    )
    try:
        wait_ready(proc)
        assert proc.stdout is not None
        first = killer(proc.pid, signal.SIGTERM)
        log = proc.stdout.readline()
        assert log.startswith(f"[SIGTERM from pid {first.pid} ({sys.executable} -c "), log
        assert log.endswith(
            "): ending after this step with a checkpoint; Ctrl-C again to stop at once]\n"
        ), log
        assert proc.stdout.readline().startswith(f"stop {int(signal.SIGTERM)} pid {first.pid} (")
        second = killer(proc.pid, signal.SIGINT)
        assert proc.stdout.readline() == "cancelled\n"
        assert proc.wait(timeout=30) == 0
        first.wait()
        second.wait()
    finally:
        proc.kill()


def test_the_front_is_refused_where_other_threads_run() -> None:
    # This process has torch's threads: blocking the signals now would leave them with
    # threads that still take them, so nothing is changed.
    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    assert not signals.install_front()
    assert not signals.front_installed()
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before


def test_a_sender_outside_the_process_namespace_or_the_kernel() -> None:
    def info(pid: int, code: int) -> signal.struct_siginfo:
        return signal.struct_siginfo((int(signal.SIGTERM), code, 0, pid, 0, 0, 0))

    assert str(signals.sender_of(info(0, 0x80))).startswith("the kernel")
    assert str(signals.sender_of(info(0, 0))).startswith("a process outside this PID namespace")
    me = signals.sender_of(info(os.getpid(), 0))
    assert str(me).startswith(f"pid {os.getpid()} (this process) (")
    assert me.command == signals.command_line(os.getpid()) != ""


def test_a_sender_that_exited_is_named_by_what_is_left() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    stat = Path(f"/proc/{child.pid}/stat")
    while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert signals.command_line(child.pid).startswith("[python")  # a zombie keeps its name
    child.wait()
    assert signals.command_line(child.pid) == ""
    assert "exited before it could be named" in str(signals.Sender(child.pid, ""))
