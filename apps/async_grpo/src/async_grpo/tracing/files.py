"""The per-process span files of a run -> one Chrome trace, and reading a trace back.

`merge` turns `<out_dir>/trace/*.jsonl` (written by `tracing.Tracer`) into `trace.json` in the
Chrome Trace Event format, which Perfetto (ui.perfetto.dev) and chrome://tracing open: one
process per component process (`generator 0`, `trainer`, ...), one thread per lane of a
track, complete events (`"ph": "X"`) in microseconds since the run's first process started.
A process file cut short by a kill (a torn last line, no closing footer) is tolerated: what
was written is kept, and the process gets an instant event "trace cut short" and a note.

`load_trace` reads such a file back into `Trace` (what the report computes from), and salvages
the complete events of a `trace.json` that was itself cut off mid-write.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

KIND_ORDER = ("controller", "dataset", "generator", "reward", "reference", "buffer", "trainer")
"""The order of the processes in the timeline, top to bottom; other kinds follow."""


class TraceError(ValueError):
    """A trace file or directory that holds no usable trace."""


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """One process of the trace: its display `name`, component `kind`, trace `pid`, the OS
    pid it ran as, and whether its trace file ended cleanly (`complete`) with `status`."""

    pid: int
    name: str
    kind: str
    os_pid: int | None
    complete: bool
    status: str


@dataclasses.dataclass(frozen=True)
class SpanEvent:
    """One span, in seconds since the trace's origin. `wait`: time spent waiting, not busy."""

    process: str
    kind: str
    lane: str
    name: str
    start_s: float
    end_s: float
    wait: bool
    args: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Trace:
    """A merged trace: spans sorted by start, the processes, and whether the run was cut
    short (the controller did not close its trace cleanly, or the file itself is torn),
    with human-readable `notes` on what is missing. `end_s`: the last span's end."""

    spans: tuple[SpanEvent, ...]
    processes: tuple[ProcessInfo, ...]
    cut_short: bool
    notes: tuple[str, ...]
    end_s: float


@dataclasses.dataclass
class _ProcessFile:
    header: dict[str, Any]
    lanes: dict[int, str]
    events: list[dict[str, Any]]
    end: dict[str, Any] | None
    dropped: int


def _read_process_file(path: Path) -> _ProcessFile | None:
    """Parses one per-process file; None when even its header is unreadable."""
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    records: list[dict[str, Any]] = []
    dropped = 0
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            dropped += 1  # a line torn by a kill mid-write
            continue
        if isinstance(record, dict):
            records.append(record)
    if not records or records[0].get("type") != "process":
        return None
    out = _ProcessFile(records[0], {}, [], None, dropped)
    for r in records[1:]:
        kind = r.get("type")
        if kind == "lane":
            out.lanes[int(r["id"])] = str(r["name"])
        elif kind in ("X", "C"):
            out.events.append(r)
        elif kind == "end":
            out.end = r
    return out


def _order(kind: str) -> int:
    return KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)


def merge(trace_dir: Path, out_path: Path) -> Trace:
    """Merges every process file in `trace_dir` into the Chrome trace `out_path` (written
    whole, then renamed into place) and returns it as a `Trace`. Raises `TraceError` when
    the directory holds no readable process file."""
    files = sorted(Path(trace_dir).glob("*.jsonl"))
    parsed = [(p, _read_process_file(p)) for p in files]
    notes = [f"{p.name}: no readable header, skipped" for p, f in parsed if f is None]
    procs = [f for _, f in parsed if f is not None]
    if not procs:
        raise TraceError(f"{trace_dir}: no trace files of a run (expected <kind>-<pid>.jsonl)")
    procs.sort(
        key=lambda f: (_order(f.header["kind"]), f.header.get("index") or 0, f.header["start_us"])
    )
    origin = min(float(f.header["start_us"]) for f in procs)
    per_kind: dict[str, int] = {}
    for f in procs:
        per_kind[f.header["kind"]] = per_kind.get(f.header["kind"], 0) + 1
    seen: dict[str, int] = {}
    events: list[dict[str, Any]] = []
    infos: list[dict[str, Any]] = []
    cut_short = not any(f.header["kind"] == "controller" for f in procs)
    if cut_short:
        notes.append("no controller trace: the run's outcome is unknown")
    for pid, f in enumerate(procs, start=1):
        kind = str(f.header["kind"])
        index = f.header.get("index")
        if index is None:
            index = seen.get(kind, 0)
            seen[kind] = index + 1
        name = kind if per_kind[kind] == 1 and f.header.get("index") is None else f"{kind} {index}"
        status = str(f.end["status"]) if f.end else "cut short"
        events.append(_meta("process_name", pid, None, {"name": name}))
        events.append(_meta("process_sort_index", pid, None, {"sort_index": pid}))
        for lane_id, lane in sorted(f.lanes.items()):
            events.append(_meta("thread_name", pid, lane_id + 1, {"name": lane}))
            events.append(_meta("thread_sort_index", pid, lane_id + 1, {"sort_index": lane_id}))
        last = float(f.header["start_us"])
        for e in f.events:
            out: dict[str, Any] = {"name": e["name"], "ph": e["type"], "pid": pid}
            out["ts"] = round(float(e["ts"]) - origin, 3)
            if e["type"] == "X":
                out.update(cat=e["cat"], tid=int(e["lane"]) + 1, dur=e["dur"])
                last = max(last, float(e["ts"]) + float(e["dur"]))
            else:
                out["tid"] = 0
                last = max(last, float(e["ts"]))
            if e.get("args"):
                out["args"] = e["args"]
            events.append(out)
        if f.end is None:
            t = round(last - origin, 3)
            events.append(
                {"name": "trace cut short", "ph": "i", "s": "p", "pid": pid, "tid": 0, "ts": t}
            )
            notes.append(
                f"{name} (pid {f.header['pid']}) stopped recording at {t / 1e6:.1f} s "
                "without closing its trace: killed or still running"
            )
            cut_short = cut_short or kind == "controller"
        elif kind == "controller" and status != "ok":
            notes.append(f"the controller ended with {status}")
            cut_short = True
        if f.dropped:
            notes.append(f"{name}: {f.dropped} torn line(s) dropped")
        infos.append(
            {
                "pid": pid,
                "name": name,
                "kind": kind,
                "os_pid": f.header["pid"],
                "complete": f.end is not None,
                "status": status,
            }
        )
    other = {
        "origin_unix_us": origin,
        "clock": "unix time, microseconds since origin",
        "cut_short": cut_short,
        "notes": notes,
        "processes": infos,
    }
    _write(out_path, other, events)
    return _to_trace(other, events, torn=False)


def _meta(name: str, pid: int, tid: int | None, args: dict[str, Any]) -> dict[str, Any]:
    event: dict[str, Any] = {"name": name, "ph": "M", "pid": pid, "args": args}
    if tid is not None:
        event["tid"] = tid
    return event


def _write(path: Path, other: dict[str, Any], events: Iterable[dict[str, Any]]) -> None:
    """One event a line, the run's facts first, so a torn copy still says what it was."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write('{"otherData": ' + json.dumps(other) + ',\n"displayTimeUnit": "ms",\n')
        f.write('"traceEvents": [\n')
        f.write(",\n".join(json.dumps(e, default=str) for e in events))
        f.write("\n]}\n")
    os.replace(tmp, path)


def _salvage(text: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The complete events of a Chrome trace cut off mid-file (object or array form)."""
    decoder = json.JSONDecoder()
    other: dict[str, Any] = {}
    key = text.find('"otherData"')
    if key >= 0:
        colon = text.index(":", key)
        with_ws = len(text) - len(text[colon + 1 :].lstrip())
        try:
            value, _ = decoder.raw_decode(text, with_ws)
            other = value if isinstance(value, dict) else {}
        except json.JSONDecodeError:
            other = {}
    start = text.find('"traceEvents"')
    pos = text.index("[", start) + 1 if start >= 0 else text.find("[") + 1
    if pos <= 0:
        return other, []
    events: list[dict[str, Any]] = []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        try:
            event, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            break
        if isinstance(event, dict):
            events.append(event)
    return other, events


def load_trace(path: Path) -> Trace:
    """Reads a Chrome trace written by `merge` (or any with `X` events). A file torn mid-write
    yields its complete events, marked cut short. Raises `TraceError` when nothing is usable."""
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    torn = False
    events: list[Any]
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        torn = True
        other, events = _salvage(text)
    else:
        if isinstance(data, list):
            other, events = {}, data
        elif isinstance(data, dict) and isinstance(data.get("traceEvents"), list):
            other, events = data.get("otherData") or {}, data["traceEvents"]
        else:
            raise TraceError(f"{path}: not a Chrome trace (no traceEvents list)")
    events = [e for e in events if isinstance(e, dict)]  # a foreign file may hold anything
    if not any(e.get("ph") == "X" for e in events):
        raise TraceError(f"{path}: no complete span events in the trace")
    return _to_trace(other, events, torn)


def _to_trace(other: dict[str, Any], events: list[dict[str, Any]], torn: bool) -> Trace:
    names: dict[int, str] = {}
    lanes: dict[tuple[int, int], str] = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            names[int(e["pid"])] = str(e["args"]["name"])
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            lanes[(int(e["pid"]), int(e["tid"]))] = str(e["args"]["name"])
    kinds = {int(p["pid"]): str(p["kind"]) for p in other.get("processes", [])}
    spans: list[SpanEvent] = []
    for e in events:
        if e.get("ph") != "X":
            continue
        pid, tid = int(e["pid"]), int(e.get("tid", 0))
        process = names.get(pid, f"pid {pid}")
        start = float(e["ts"]) / 1e6
        spans.append(
            SpanEvent(
                process=process,
                kind=kinds.get(
                    pid, process.rsplit(" ", 1)[0] if process[-1:].isdigit() else process
                ),
                lane=lanes.get((pid, tid), f"thread {tid}"),
                name=str(e.get("name", "")),
                start_s=start,
                end_s=start + float(e.get("dur", 0.0)) / 1e6,
                wait=e.get("cat") == "wait",
                args=dict(e.get("args") or {}),
            )
        )
    spans.sort(key=lambda s: (s.start_s, -s.end_s))
    procs = tuple(
        ProcessInfo(
            int(p["pid"]),
            str(p["name"]),
            str(p["kind"]),
            p.get("os_pid"),
            bool(p["complete"]),
            str(p["status"]),
        )
        for p in other.get("processes", [])
    )
    if not procs:
        procs = tuple(
            ProcessInfo(pid, n, n.split(" ")[0], None, True, "unknown")
            for pid, n in sorted(names.items())
        )
    notes = list(other.get("notes", []))
    if torn:
        notes.append(f"the trace file is torn: {len(spans)} complete spans were recovered")
    return Trace(
        spans=tuple(spans),
        processes=procs,
        cut_short=bool(other.get("cut_short", False)) or torn,
        notes=tuple(notes),
        end_s=max((s.end_s for s in spans), default=0.0),
    )
