"""Stop signals with their senders (`launch.signals.run_watched`): a SIGINT or SIGTERM
arrives with the process that sent it.

Real signals from real processes: each test starts a fresh interpreter that runs a
coroutine under `run_watched` (as the `async-grpo` command runs a run), then a separate
"killer" process sends it the signal with `os.kill`; the interpreter reports the sender it
was given, which must be the killer's pid and command line. A signal that reached the test
process itself by mistake would end pytest, so none is sent to it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from async_grpo.launch import signals

# Sends signal `argv[2]` to pid `argv[1]`, then stays a moment, as a real sender (a shell,
# a process manager) does.
KILLER = "import os, sys, time; os.kill(int(sys.argv[1]), int(sys.argv[2])); time.sleep(3)"


def killer(pid: int, signum: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", KILLER, str(pid), str(int(signum))])


def start(script: str) -> subprocess.Popen[str]:
    """A fresh interpreter running `script`; it prints "ready" when it waits for a signal."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_ready(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line == "ready\n", line + proc.stdout.read()


@pytest.mark.slow  # a Python process of its own, seconds
def test_a_listening_run_gets_each_signal_with_its_sender() -> None:
    # Other threads (here plain ones; torch's and Monarch's in the app) do not block the
    # signals, and still the main thread, waiting for them, is handed each one.
    proc = start(
        """
        import asyncio, json, threading
        from async_grpo.launch import signals

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

        signals.run_watched(main())
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


@pytest.mark.slow  # a Python process of its own, seconds
def test_with_no_run_listening_a_signal_does_what_it_did() -> None:
    # SIGINT cancels the coroutine (KeyboardInterrupt out of run_watched, as out of
    # asyncio.run); SIGTERM ends the process.
    proc = start(
        """
        import asyncio
        from async_grpo.launch import signals

        async def wait():
            print("ready", flush=True)
            await asyncio.sleep(60)

        try:
            signals.run_watched(wait())
        except KeyboardInterrupt:
            print("KeyboardInterrupt", flush=True)
        signals.run_watched(wait())
        """
    )
    try:
        wait_ready(proc)
        assert proc.stdout is not None
        killer(proc.pid, signal.SIGINT).wait()
        assert proc.stdout.readline() == "KeyboardInterrupt\n"
        wait_ready(proc)
        killer(proc.pid, signal.SIGTERM).wait()
        assert proc.wait(timeout=30) == -signal.SIGTERM
    finally:
        proc.kill()


@pytest.mark.slow  # a Python process of its own, seconds
def test_a_run_names_the_sender_and_a_second_signal_stops_it_at_once() -> None:
    # The app's handling (`train._stop_on_signals`): the first SIGTERM asks for a stop after
    # the step and logs who sent it; a second signal cancels the run.
    proc = start(
        """
        import asyncio
        from async_grpo.controller.context import StopRequest
        from async_grpo.launch.signals import run_watched
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
            run_watched(main())
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


def test_the_processes_a_watched_run_starts_take_their_signals() -> None:
    # Only the main thread blocks the signals: a Monarch process the run spawns, and a
    # Python subprocess it starts, begin with none blocked (`exec` would keep a mask).
    proc = start(
        """
        import asyncio, subprocess, sys
        import cloudpickle
        from monarch.actor import Actor, endpoint, this_host
        from async_grpo.launch.signals import run_watched

        def blocked():
            status = open("/proc/self/status").read().splitlines()
            return int(next(l for l in status if l.startswith("SigBlk:")).split()[1], 16)

        class Probe(Actor):
            @endpoint
            def blocked(self) -> int:
                return blocked()

        cloudpickle.register_pickle_by_value(sys.modules[__name__])

        async def main():
            procs = this_host().spawn_procs(per_host={"procs": 1})
            try:
                print(await procs.spawn("probe", Probe).blocked.call_one(), flush=True)
            finally:
                await procs.stop()
            out = subprocess.run(
                [sys.executable, "-c", "print(open('/proc/self/status').read())"],
                capture_output=True, text=True, check=True,
            ).stdout
            line = next(l for l in out.splitlines() if l.startswith("SigBlk:"))
            print(int(line.split()[1], 16), flush=True)

        run_watched(main())
        """
    )
    try:
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, out[-3000:]
        masks = [int(line) for line in out.splitlines() if line.strip().isdigit()]
        stop_bits = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGTERM - 1))
        assert len(masks) == 2, out[-3000:]
        assert [m & stop_bits for m in masks] == [0, 0], masks
    finally:
        proc.kill()


def test_run_watched_belongs_to_the_main_thread() -> None:
    errors: list[BaseException] = []

    async def nothing() -> None:
        return None

    def call() -> None:
        coro = nothing()
        try:
            signals.run_watched(coro)
        except RuntimeError as e:
            errors.append(e)
            coro.close()

    t = threading.Thread(target=call)
    t.start()
    t.join()
    assert "main thread" in str(errors[0])
    assert not signals.watching()


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


def test_a_wait_that_returns_no_stop_signal_is_ignored() -> None:
    # `sigtimedwait` returned a siginfo with a garbage signal number (1461153528) while
    # py-spy sampled the controller, and the run ended as if stopped: it must go on.
    proc = start(
        """
        import asyncio, signal
        from async_grpo.launch import signals

        real = signal.sigtimedwait
        answers = [signal.struct_siginfo((1461153528, 0, 0, 11, 0, 0, 0))]

        def sigtimedwait(sigset, timeout):
            return answers.pop() if answers else real(sigset, timeout)

        signal.sigtimedwait = sigtimedwait
        heard = []

        async def run():
            stop = signals.listen(asyncio.get_running_loop(), lambda n, s: heard.append(n))
            print("ready", flush=True)
            while answers:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            stop()
            return "finished"

        print(signals.run_watched(run()), heard, flush=True)
        """
    )
    try:
        wait_ready(proc)
        assert proc.stdout is not None
        assert proc.stdout.read() == "finished []\n"
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
