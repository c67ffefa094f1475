"""Which process asked the job to stop: SIGINT and SIGTERM received with their senders.

Python's signal handlers are not told who sent a signal; `signal.sigwaitinfo` is (the
sender's pid, `si_pid`). It can only wait for a signal that every thread of the process
blocks: the kernel hands a process's signal to any one thread that does not block it, and
there the C handler Python installed runs instead, sender unknown. A thread starts with the
mask of the thread that started it, and torch and Monarch start theirs at import. So
`install_front()` blocks SIGINT and SIGTERM while the process has a single thread (the
`async-grpo` command calls it first, `cli/entry.py`), and one thread, the front, then
receives every SIGINT and SIGTERM the process gets, with its sender: the pid and the
command line, read from /proc while the sender is most likely still there.

While a run listens (`listen`) the front hands it each signal and its sender. Otherwise a
signal does what it did before the front: SIGINT raises KeyboardInterrupt in the main
thread (or runs whatever handler is installed), SIGTERM ends the process, an ignored one is
dropped.

Without the front (a run started in a process that already had threads: a test, a
notebook), Python's handlers get the signals as before and the sender is not known.
Children started through Python's `subprocess` inherit the blocked signals (`exec` keeps
a mask; Monarch's launcher clears it for the processes it starts): `unblocked()` lets a
thread start one with the signals deliverable.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})

# Sent to the main thread, whose handler does nothing, after a stop signal's Python handler
# was set to run there: it ends the system call the main thread may be blocked in (a sleep,
# a read), as the signal itself would have, so that the handler runs at once.
_WAKE_MAIN = signal.SIGRTMAX - 3

_SI_KERNEL = 0x80  # si_code of a signal the kernel sent (a terminal's Ctrl-C or hang-up)
_COMMAND_CHARS = 200


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
    """Who sent the signal `info` describes (`signal.sigwaitinfo`'s answer)."""
    if info.si_pid == 0:
        return Sender(0, "", by_kernel=info.si_code == _SI_KERNEL)
    return Sender(info.si_pid, command_line(info.si_pid))


Listener = Callable[[int, Sender], None]
"""`listener(signum, sender)`, called on the listening run's event loop."""


class _Front:
    """The thread that receives SIGINT and SIGTERM for the whole process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listener: Callable[[int, Sender], bool] | None = None
        self._thread = threading.Thread(target=self._serve, name="stop-signals", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            info = signal.sigwaitinfo(STOP_SIGNALS)
            sender = sender_of(info)
            with self._lock:
                listener = self._listener
            if listener is None or not listener(info.si_signo, sender):
                _as_if_unblocked(info.si_signo)

    def listen(self, deliver: Callable[[int, Sender], bool]) -> Callable[[], None]:
        with self._lock:
            if self._listener is not None:
                raise RuntimeError("a run already listens for stop signals in this process")
            self._listener = deliver

        def stop() -> None:
            with self._lock:
                self._listener = None

        return stop


def _as_if_unblocked(signum: int) -> None:
    """Has `signum` do what it would have done without the front: delivered to this thread,
    unblocked for that moment, it is dropped if ignored, ends the process if that is its
    default action, or runs the handler installed (Python's runs in the main thread:
    KeyboardInterrupt for SIGINT by default)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    try:
        signal.pthread_kill(threading.get_ident(), signum)  # delivered as this call returns
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
    if callable(signal.getsignal(signum)):
        main = threading.main_thread().ident
        if main is not None:
            signal.pthread_kill(main, _WAKE_MAIN)


class _Installed:
    """The process's front, once `install_front` started it."""

    front: _Front | None = None


def install_front() -> bool:
    """Blocks SIGINT and SIGTERM in this process and starts the front, so that every one
    received from then on is named with its sender. Call it from the main thread before
    anything starts another; returns whether the front runs (False, nothing changed, where
    another thread already runs or `sigwaitinfo` does not exist: not Linux)."""
    if _Installed.front is not None:
        return True
    if not hasattr(signal, "sigwaitinfo") or _threads() != 1:
        return False
    signal.signal(_WAKE_MAIN, _ignore)  # a Python handler: a system call it ends fails EINTR
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    _Installed.front = _Front()
    return True


def _ignore(signum: int, frame: object) -> None:
    del signum, frame


def _threads() -> int:
    """Threads of this process, those Python did not start included (0: not known here)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def front_installed() -> bool:
    """Whether this process's stop signals arrive with their senders (`install_front`)."""
    return _Installed.front is not None


def listen(loop: asyncio.AbstractEventLoop, listener: Listener) -> Callable[[], None]:
    """Until the returned function is called, each SIGINT and SIGTERM the front receives
    goes to `listener` on `loop`, with its sender. Requires the front (`front_installed`);
    one listener at a time."""
    front = _Installed.front
    if front is None:
        raise RuntimeError("no stop-signal front in this process (install_front)")

    def deliver(signum: int, sender: Sender) -> bool:
        try:
            loop.call_soon_threadsafe(listener, signum, sender)
        except RuntimeError:  # the loop closed: the run is over
            return False
        return True

    return front.listen(deliver)


@contextlib.contextmanager
def unblocked() -> Iterator[None]:
    """Within it, SIGINT and SIGTERM are not blocked in the calling thread, so that a
    process started through Python's `subprocess` does not inherit them blocked. A signal
    that arrives meanwhile may go to Python's handler (sender unknown)."""
    if _Installed.front is None:
        yield
        return
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
