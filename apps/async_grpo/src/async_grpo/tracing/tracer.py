"""Spans from every process of a run, on one clock, for a Chrome-trace timeline.

Each process records its own spans into a buffer and appends them, one JSON object a line, to
its own file `<out_dir>/trace/<kind>-<pid>.jsonl`; the controller merges the files into
`<out_dir>/trace.json` at the end of the run (`trace_files.merge`), and `report` merges what
is there after a killed run. No span crosses a process boundary, so recording needs no
messages and no locks shared between processes.

    with tracing.span("generate", version=v, prompts=len(prompts)) as s:
        ...
        s.set(tokens=n)                      # arguments known only at the end

    @tracing.traced("score")                 # sync or async functions
    async def score(...): ...

When no tracer is started in the process, `span` returns one shared do-nothing object, so
instrumented code costs a function call and a global read. The controller turns tracing on
for a run with `session(out_dir)`: it exports `TRACE_ENV` so every process spawned meanwhile
finds the directory, and each actor calls `start_from_env(kind)` in its constructor.

The clock: every timestamp is `perf_counter_ns()` (monotonic, fine-grained) plus the
process's offset to the Unix epoch, `time_ns() - perf_counter_ns()`, taken once at start.
Processes on one host share the system clock, so their spans line up to about a
microsecond; on several hosts the alignment is as good as the hosts' clock sync.

Spans on one track never overlap partially: a span nests in the innermost open span of its
track only when both run in the same asyncio task (or thread); otherwise it takes the first
free lane of the track (`rollout`, `rollout 2`, ...), so concurrent loops get lanes of their
own. `wait=True` marks time spent waiting (category `wait`): it is not counted as busy.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import contextvars
import functools
import inspect
import json
import os
import shutil
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, ParamSpec, TypeVar, cast

TRACE_ENV = "ASYNC_GRPO_TRACE_DIR"
"""The environment variable naming the trace directory of the running session."""

FORMAT = 1
"""Version of the per-process file format (the `process` header line carries it)."""

_Event = tuple[str, bool, int, int, int, dict[str, Any]]
"""A closed span before encoding: name, wait, lane id, start and end (perf_counter ns), args."""

_P = ParamSpec("_P")
_R = TypeVar("_R")


class _Lane:
    """One non-overlapping row of a track: a stack of the spans open on it."""

    __slots__ = ("id", "name", "stack")

    def __init__(self, lane_id: int, name: str) -> None:
        self.id, self.name = lane_id, name
        self.stack: list[Span] = []


def _owner() -> object:
    """What a span may nest in: the running asyncio task, or the thread outside any loop."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    return task if task is not None else threading.get_ident()


_current: contextvars.ContextVar[Span | None] = contextvars.ContextVar("trace_span", default=None)


class Span:
    """One timed region; use it as a (sync) context manager. `args` become the Chrome event's
    arguments (JSON-encoded with `str` for anything else)."""

    __slots__ = (
        "_lane",
        "_owner",
        "_token",
        "_tracer",
        "args",
        "name",
        "start_ns",
        "track",
        "wait",
    )

    def __init__(self, tracer: Tracer, name: str, track: str, wait: bool, args: dict[str, Any]):
        self._tracer, self.name, self.track, self.wait, self.args = tracer, name, track, wait, args
        self._lane: _Lane | None = None
        self._owner: object = None
        self._token: contextvars.Token[Span | None] | None = None
        self.start_ns = 0

    def set(self, **args: Any) -> None:
        """Adds arguments (sizes, versions) learned while the span ran."""
        self.args.update(args)

    def __enter__(self) -> Span:
        self._owner = _owner()
        self._lane = self._tracer._open(self, _current.get())
        self._token = _current.set(self)
        self.start_ns = time.perf_counter_ns()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        end = time.perf_counter_ns()
        if exc_type is not None:
            self.args["error"] = exc_type.__name__
        if self._token is not None:
            with contextlib.suppress(ValueError):  # exited in another context than entered
                _current.reset(self._token)
        self._tracer._close(self, end)


class _NullSpan:
    """What `span` returns while tracing is off: every method does nothing."""

    __slots__ = ()

    def set(self, **args: Any) -> None:
        pass

    def __enter__(self) -> _NullSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


NULL_SPAN = _NullSpan()


class Tracer:
    """Records the spans of this process into `path` (appending JSON lines).

    `kind` names the component ("generator", "trainer", ...), `index` its rank when it has
    one (a trainer rank; replicas of a service are told apart by pid). Buffered events are
    written every `flush_s` seconds by a daemon thread, when 512 are pending, and at `close`
    (also at interpreter exit), so a killed process loses at most the last `flush_s`."""

    def __init__(self, path: Path, kind: str, index: int | None = None, flush_s: float = 0.5):
        self.path, self.kind, self.index = path, kind, index
        self.offset_ns = time.time_ns() - time.perf_counter_ns()
        self._lock = threading.Lock()  # lanes and the pending list
        self._io_lock = threading.Lock()  # the file
        self._pending: list[str | _Event] = []
        self._lanes: dict[str, list[_Lane]] = {}
        self._lane_count = 0
        self._closed = False
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")
        header = {
            "type": "process",
            "format": FORMAT,
            "kind": kind,
            "index": index,
            "pid": os.getpid(),
            "host": os.uname().nodename,
            "start_us": self._us(time.perf_counter_ns()),
        }
        self._write([json.dumps(header)])
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._flush_loop, args=(flush_s,), name="trace-flush", daemon=True
        )
        self._thread.start()
        atexit.register(self.close)

    def _us(self, perf_ns: int) -> float:
        return round((perf_ns + self.offset_ns) / 1000, 3)

    def span(self, name: str, track: str = "main", wait: bool = False, **args: Any) -> Span:
        return Span(self, name, track, wait, args)

    def counter(self, name: str, **values: float) -> None:
        """A sampled value over time (e.g. the buffer's size), shown as a counter track."""
        event = {"type": "C", "name": name, "ts": self._us(time.perf_counter_ns()), "args": values}
        self._append(json.dumps(event))

    def _open(self, span: Span, parent: Span | None) -> _Lane:
        with self._lock:
            lanes = self._lanes.setdefault(span.track, [])
            if parent is not None and parent.track == span.track and parent._owner is span._owner:
                lane = parent._lane
                if lane is not None and lane.stack and lane.stack[-1] is parent:
                    lane.stack.append(span)
                    return lane
            lane = next((ln for ln in lanes if not ln.stack), None)
            if lane is None:
                name = span.track if not lanes else f"{span.track} {len(lanes) + 1}"
                lane = _Lane(self._lane_count, name)
                self._lane_count += 1
                lanes.append(lane)
                self._pending.append(json.dumps({"type": "lane", "id": lane.id, "name": name}))
            lane.stack.append(span)
            return lane

    def _close(self, span: Span, end_ns: int) -> None:
        lane = span._lane
        assert lane is not None, "a span closed that was never opened"
        # Encoded at flush time, off the instrumented code's path.
        event = (span.name, span.wait, lane.id, span.start_ns, end_ns, span.args)
        with self._lock:
            if lane.stack and lane.stack[-1] is span:
                lane.stack.pop()
            elif span in lane.stack:
                lane.stack.remove(span)
            self._pending.append(event)
            full = len(self._pending) >= 512
        if full:
            self.flush()

    def _append(self, line: str) -> None:
        with self._lock:
            self._pending.append(line)

    def _encode(self, item: str | _Event) -> str:
        if isinstance(item, str):
            return item
        name, wait, lane, start_ns, end_ns, args = item
        event: dict[str, Any] = {
            "type": "X",
            "name": name,
            "cat": "wait" if wait else "busy",
            "lane": lane,
            "ts": self._us(start_ns),
            "dur": round((end_ns - start_ns) / 1000, 3),
        }
        if args:
            event["args"] = args
        return json.dumps(event, default=str)

    def flush(self) -> None:
        """Writes every pending event to the file (one `write`, then the OS has them)."""
        with self._io_lock:  # batches reach the file in the order they were taken
            with self._lock:
                items, self._pending = self._pending, []
            self._write([self._encode(item) for item in items])

    def _write(self, lines: list[str]) -> None:
        if lines and not self._file.closed:
            self._file.write("\n".join(lines) + "\n")
            self._file.flush()

    def _flush_loop(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            with contextlib.suppress(ValueError):  # the file was closed meanwhile
                self.flush()

    def close(self, status: str = "ok") -> None:
        """Flushes and writes the footer that says the process ended cleanly (`status` "ok",
        or what went wrong). A file without it was cut short."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self.flush()
        end = {"type": "end", "status": status, "ts": self._us(time.perf_counter_ns())}
        with self._io_lock:
            self._write([json.dumps(end)])
            self._file.close()
        atexit.unregister(self.close)


_tracer: Tracer | None = None


def active() -> Tracer | None:
    """The tracer of this process, or None when tracing is off."""
    return _tracer


def start(trace_dir: Path, kind: str, index: int | None = None) -> Tracer:
    """Starts recording this process's spans into `trace_dir` (idempotent per process)."""
    global _tracer  # noqa: PLW0603 - one tracer per process, by design
    if _tracer is None or _tracer._closed:
        name = f"{kind}-{index}-{os.getpid()}" if index is not None else f"{kind}-{os.getpid()}"
        _tracer = Tracer(Path(trace_dir) / f"{name}.jsonl", kind, index)
    return _tracer


def start_from_env(kind: str, index: int | None = None) -> Tracer | None:
    """`start` in the directory the controller exported in `TRACE_ENV`; None when unset."""
    trace_dir = os.environ.get(TRACE_ENV)
    return start(Path(trace_dir), kind, index) if trace_dir else None


def stop(status: str = "ok") -> None:
    """Closes this process's tracer (writing its footer); tracing is off afterwards."""
    global _tracer  # noqa: PLW0603
    if _tracer is not None:
        _tracer.close(status)
        _tracer = None


def span(name: str, *, track: str = "main", wait: bool = False, **args: Any) -> Span | _NullSpan:
    """A span named `name` on `track` with `args`; a no-op when tracing is off."""
    tracer = _tracer
    if tracer is None:
        return NULL_SPAN
    return Span(tracer, name, track, wait, args)


def counter(name: str, **values: float) -> None:
    """Records a counter sample when tracing is on."""
    if _tracer is not None:
        _tracer.counter(name, **values)


def traced(
    name: str | None = None, *, track: str = "main", wait: bool = False
) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Decorator: every call of the function (sync or async) is one span."""

    def wrap(fn: Callable[_P, _R]) -> Callable[_P, _R]:
        label = name or fn.__name__
        if inspect.iscoroutinefunction(fn):
            afn = cast("Callable[_P, Awaitable[Any]]", fn)

            @functools.wraps(fn)
            async def run_async(*args: _P.args, **kwargs: _P.kwargs) -> Any:
                with span(label, track=track, wait=wait):
                    return await afn(*args, **kwargs)

            return cast("Callable[_P, _R]", run_async)

        @functools.wraps(fn)
        def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            with span(label, track=track, wait=wait):
                return fn(*args, **kwargs)

        return run

    return wrap


@contextlib.contextmanager
def session(out_dir: Path, enabled: bool = True) -> Iterator[Tracer | None]:
    """The controller's side of one run: clears `<out_dir>/trace/`, exports `TRACE_ENV` for
    the processes spawned inside the block, records the controller's own spans, and on exit
    (clean, error or Ctrl-C) closes them with the outcome and merges every process's file
    into `<out_dir>/trace.json`. `enabled=False` records nothing and writes no trace."""
    if not enabled:
        yield None
        return
    from async_grpo.tracing.files import merge  # noqa: PLC0415 - only the controller merges

    trace_dir = Path(out_dir) / "trace"
    shutil.rmtree(trace_dir, ignore_errors=True)
    trace_dir.mkdir(parents=True)
    previous = os.environ.get(TRACE_ENV)
    os.environ[TRACE_ENV] = str(trace_dir)
    stop()  # a tracer left from an earlier run in this process belongs to that run
    tracer = start(trace_dir, "controller")
    status = "ok"
    try:
        yield tracer
    except BaseException as e:
        status = type(e).__name__
        raise
    finally:
        stop(status)
        if previous is None:
            os.environ.pop(TRACE_ENV, None)
        else:
            os.environ[TRACE_ENV] = previous
        merge(trace_dir, Path(out_dir) / "trace.json")
