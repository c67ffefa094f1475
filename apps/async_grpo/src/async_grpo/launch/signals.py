"""Which process asked the job to stop: SIGINT and SIGTERM received with their senders.

Python's signal handlers are not told who sent a signal; `signal.sigtimedwait` is (the
sender's pid, `si_pid`). The kernel hands a signal sent to a process to its main thread
first, when that thread does not block it or is waiting for it in `sigtimedwait`, and
otherwise to any other thread that does not block it, where Python's C handler runs,
sender unknown. Blocking the signals in every thread instead would pass them on blocked to
every process those threads start (`exec` keeps a mask: Monarch's processes would ignore
their SIGTERM). So `run_watched(coro)` runs the coroutine (a run) on an event loop in a
thread of its own while the main thread does nothing but wait for SIGINT and SIGTERM, with
them blocked there (a fatal signal that arrived between two waits would otherwise end the
process before it is waited for), and hands each one, with its sender, to the run that
listens (`listen`). The sender's command line is read from /proc at once, while it most
likely still runs.

Between two waits a signal may still reach another thread; Python's handlers, installed
for the watch, hand it over too, sender unknown, as they do a SIGINT raised inside the
process (`_thread.interrupt_main`). A signal while no run listens (before the run starts
listening, after it stops) does what it would have done: SIGINT cancels the coroutine (as
`asyncio.run` does on Ctrl-C: `KeyboardInterrupt`), SIGTERM ends the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})

_SI_KERNEL = 0x80  # si_code of a signal the kernel sent (a terminal's Ctrl-C or hang-up)
_COMMAND_CHARS = 200
_WAIT_S = 0.2  # the main thread's longest wait: how soon it sees the run end

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Sender:
    """The process that sent a signal: its pid and its command line (its name in brackets,
    as `ps` shows it, when only that is left: the sender exited and was not yet reaped; ""
    when gone). pid 0: not a process of this PID namespace, `by_kernel` telling the kernel
    (a terminal's Ctrl-C or hang-up) from a process outside the namespace (a container's
    runtime, the host)."""

    pid: int
    command: str
    by_kernel: bool = False

    def __str__(self) -> str:
        if self.pid == 0 and self.by_kernel:
            return "the kernel (a terminal's Ctrl-C or hang-up)"
        if self.pid == 0:
            return "a process outside this PID namespace (a container's runtime, the host)"
        own = " (this process)" if self.pid == os.getpid() else ""
        command = self.command or "exited before it could be named"
        return f"pid {self.pid}{own} ({command})"


def command_line(pid: int) -> str:
    """`pid`'s command line from /proc, its arguments joined by spaces, cut at 200
    characters; "[name]" for a process that exited and is not yet reaped (its command line
    is gone, its name is not); "" when it cannot be read."""
    proc = Path(f"/proc/{pid}")
    try:
        raw = (proc / "cmdline").read_bytes()
        if not raw:
            return f"[{(proc / 'comm').read_text().strip()}]"
    except OSError:
        return ""
    text = raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
    return text if len(text) <= _COMMAND_CHARS else text[: _COMMAND_CHARS - 3] + "..."


def sender_of(info: signal.struct_siginfo) -> Sender:
    """Who sent the signal `info` describes (`signal.sigtimedwait`'s answer)."""
    if info.si_pid == 0:
        return Sender(0, "", by_kernel=info.si_code == _SI_KERNEL)
    return Sender(info.si_pid, command_line(info.si_pid))


Listener = Callable[[int, "Sender | None"], None]
"""`listener(signum, sender)` (sender None: not known), called on the run's event loop."""


class _Watch:
    """One `run_watched`: the coroutine's loop and task, and the run listening, if any."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[Any] | None = None
        self.listener: tuple[asyncio.AbstractEventLoop, Listener] | None = None
        self.interrupted = False

    def handle(self, signum: int, sender: Sender | None) -> None:
        """In the main thread: one SIGINT or SIGTERM, to the run listening, else as it
        would have been without the watch."""
        with self.lock:
            listener = self.listener
        if listener is not None:
            with_loop, call = listener
            try:
                with_loop.call_soon_threadsafe(call, signum, sender)
                return
            except RuntimeError:  # its loop closed: no run listens any more
                pass
        if signum == signal.SIGINT:
            self.interrupted = True
            self.cancel()
            return
        # SIGTERM's default action, now: it ends the process.
        signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
        signal.raise_signal(signum)

    def cancel(self) -> None:
        """Cancels the coroutine, if it runs."""
        with self.lock:
            loop, task = self.loop, self.task
        if loop is not None and task is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: the coroutine is over
                loop.call_soon_threadsafe(task.cancel)


class _Active:
    """The watch running in this process, if any."""

    watch: _Watch | None = None


def watching() -> bool:
    """Whether a run in this process gets its stop signals with their senders
    (`run_watched`)."""
    return _Active.watch is not None


def listen(loop: asyncio.AbstractEventLoop, listener: Listener) -> Callable[[], None]:
    """Until the returned function is called, each SIGINT and SIGTERM the watch receives
    goes to `listener` on `loop`, with its sender. Requires a watch (`watching`); one
    listener at a time."""
    watch = _Active.watch
    if watch is None:
        raise RuntimeError("no run_watched in this process: its stop signals are not watched")
    with watch.lock:
        if watch.listener is not None:
            raise RuntimeError("a run already listens for stop signals in this process")
        watch.listener = (loop, listener)

    def stop() -> None:
        with watch.lock:
            watch.listener = None

    return stop


def run_watched(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)`, with this process's SIGINT and SIGTERM received with their
    senders (see the module's docstring): `main` runs in a thread of its own, this (the
    main) thread waits for the signals. Returns what `main` returns, raises what it raises
    (`KeyboardInterrupt` when a SIGINT cancelled it while no run listened). An exception
    raised in this thread meanwhile (a test's timeout) cancels `main`, waits for it, and
    goes on up."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("run_watched waits for signals in the main thread; call it there")
    if _Active.watch is not None:
        raise RuntimeError("run_watched is already running in this process")
    watch = _Watch()
    started = threading.Event()
    outcome: list[T] = []
    failure: list[BaseException] = []

    async def tracked() -> T:
        with watch.lock:
            watch.loop, watch.task = asyncio.get_running_loop(), asyncio.current_task()
        started.set()
        if watch.interrupted:  # a SIGINT before the loop ran: cancelled before it starts
            main.close()
            raise asyncio.CancelledError
        return await main

    def body() -> None:
        try:
            outcome.append(asyncio.run(tracked()))
        except BaseException as e:
            failure.append(e)
        finally:
            started.set()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        del frame
        watch.handle(signum, None)

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    _Active.watch = watch
    # Started before the signals are blocked here: a thread starts with its creator's mask,
    # and the processes it starts with its own.
    worker = threading.Thread(target=body, name="run", daemon=True)
    worker.start()
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        while worker.is_alive():
            info = signal.sigtimedwait(STOP_SIGNALS, _WAIT_S)
            # While `py-spy record` sampled the controller (ptrace interrupting this wait), it
            # once returned a siginfo whose signal number was garbage (1461153528), which
            # ended the run: act on a stop signal only.
            if info is not None and info.si_signo in STOP_SIGNALS:
                watch.handle(info.si_signo, sender_of(info))
    except BaseException:
        started.wait()
        watch.cancel()
        worker.join()
        raise
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for sig, handler in previous.items():
            # None: a handler not installed from Python, which cannot be put back.
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        _Active.watch = None
    if failure:
        if watch.interrupted and isinstance(failure[0], asyncio.CancelledError):
            raise KeyboardInterrupt from failure[0]
        raise failure[0]
    return outcome[0]
