"""The report half of `tools/gpu_check.sh` (`python3 tools/gpu_check.py summarize WORK OUT`):
reads every part's files (junit XML of the gpu tests, the weight-sync JSON, the app's
`metrics.jsonl`, `processes.json`, `trace.json` and the memory samples, the benchmark's JSON
rows), writes `OUT/gpu_check.json` and prints the short table (`gpu_check_table.py`).
Standard library only, so a broken install still gets its report; the app is read through
its files, never imported.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import statistics
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gpu_check_table import print_table  # the script's folder is on sys.path

PARTS = ("setup", "gpu_tests", "weight_sync", "app", "async_vs_sync")
"""The check's parts, in the order they run and are reported (the last only when asked for by
name: "not run" otherwise)."""


def summarize(work: Path, out: Path) -> int:
    """Writes OUT/gpu_check.json from the parts' files under WORK and prints the table;
    returns 1 when any part failed or timed out."""
    env = _read_json(work / "environment.json") or {}
    mode = (work / "mode").read_text().strip() if (work / "mode").exists() else "unknown"
    parts: dict[str, Any] = {}
    for name in PARTS:
        part = _read_json(work / f"{name}.status.json") or {"status": "not run"}
        part["log"] = f"{name}.log" if (out / f"{name}.log").exists() else None
        parts[name] = part
    parts["setup"]["environment"] = env
    parts["gpu_tests"]["tests"] = _junit(sorted(work.glob("junit-*.xml")))
    parts["weight_sync"]["result"] = _read_json(work / "weight_sync.json")
    parts["app"]["result"] = _app(work / "app", work / "memory.jsonl", mode)
    parts["async_vs_sync"]["result"] = {
        "all_cpus": _read_json(work / "async_vs_sync.json"),
        "two_cpus": _read_json(work / "async_vs_sync_2cpus.json"),
    }
    # "not run": left out by GPU_CHECK_PARTS.
    failed = [n for n, p in parts.items() if p["status"] not in ("passed", "skipped", "not run")]
    report = {
        "schema": 1,
        "mode": mode,
        "label": (
            "one GPU machine"
            if mode == "cuda"
            else "CPU rehearsal: no CUDA device; the CUDA parts are skipped or shrunk, and "
            "no number here says anything about a GPU"
        ),
        "started": _read_text(work / "started"),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "wall_s": _wall(work),
        "machine": _machine(env),
        "parts": parts,
        "failed": failed,
        "ok": not failed,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    print_table(report)
    print(f"wrote {out / 'gpu_check.json'}")
    return 1 if failed else 0


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _wall(work: Path) -> float | None:
    started = _read_text(work / "started_unix")
    return round(time.time() - float(started), 1) if started else None


def _machine(env: dict[str, Any]) -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": env.get("python"),
        "versions": env.get("versions"),
        "gpu": env.get("gpu"),
    }


def _junit(files: Sequence[Path]) -> list[dict[str, Any]]:
    """One row per test case of pytest's JUnit XML files: id, outcome, seconds, message."""
    rows: list[dict[str, Any]] = []
    for path in files:
        try:
            root = ET.parse(path).getroot()
        except (OSError, ET.ParseError) as e:
            rows.append({"id": path.name, "outcome": "error", "message": f"unreadable: {e}"})
            continue
        for case in root.iter("testcase"):
            outcome, message = "passed", ""
            for tag in ("failure", "error", "skipped"):
                child = case.find(tag)
                if child is not None:
                    outcome = {"failure": "failed"}.get(tag, tag)
                    message = (child.get("message") or child.text or "").strip()
                    text = child.text or ""
                    if message == "collection skipped" and "Skipped: " in text:
                        # A module skipped whole; the text is (path, line, "Skipped: why").
                        message = text.split("Skipped: ", 1)[1].rstrip("')\" ")
                    break
            classname = case.get("classname", "")
            name = case.get("name", "")
            rows.append(
                {
                    "id": f"{classname}::{name}" if classname else f"{name} (whole module)",
                    "outcome": outcome,
                    "seconds": round(float(case.get("time") or 0), 2),
                    "message": message.splitlines()[0][:300] if message else "",
                }
            )
    return rows


def _app(run_dir: Path, memory: Path, mode: str) -> dict[str, Any] | None:
    """What the app run measured, from its output files."""
    rows = _jsonl(run_dir / "metrics.jsonl")
    if not rows and not (run_dir / "trace.json").exists():
        return None
    result: dict[str, Any] = {"label": _read_text(run_dir.parent / "app.label")}
    result["command"] = _read_text(run_dir.parent / "app.command")
    if rows:
        first, last = rows[0], rows[-1]
        walls = [r["wall_s"] for r in rows]
        steps = [b - a for a, b in itertools.pairwise(walls)]
        syncs = [r["weight_sync_s"] * 1e3 for r in rows[1:] if r.get("weight_sync_s")]
        result |= {
            "steps": last["version"],
            "first_step_wall_s": round(first["wall_s"], 1),
            "last_step_wall_s": round(last["wall_s"], 1),
            "step_s_median": _round(statistics.median(steps)) if steps else None,
            "step_s_mean": _round((walls[-1] - walls[0]) / len(steps)) if steps else None,
            "tokens_per_s": _round(last["tokens_per_s"]),
            "episodes_per_s": _round(last["episodes_per_s"]),
            "weight_sync_ms_median": _round(statistics.median(syncs)) if syncs else None,
            "weight_sync_transport": last.get("weight_sync_transport"),
            "trainer_busy_metrics": _round(1 - last["trainer_idle_frac"]),
            "reward_first": _round(first["reward_window"]),
            "reward_last": _round(last["reward_window"]),
            "eval_first": _round(
                next((r["eval_reward"] for r in rows if r.get("eval_reward") is not None), None)
            ),
            "eval_last": _round(last.get("eval_reward")),
            # The seconds each checkpoint taken during the run held its step (the final
            # one, taken after the last row, is not among them).
            "checkpoint_held_s": [_round(r["checkpoint_s"]) for r in rows if r.get("checkpoint_s")],
        }
        delta = last["reward_window"] - first["reward_window"]
        result["reward_delta"] = _round(delta)
        result["reward_moved"] = abs(delta) >= 0.05
    trace = _read_json(run_dir / "trace.json")
    names = _process_names(run_dir, trace)
    if trace:
        result |= _trace_numbers(trace)
    result["memory"] = _memory(memory, names, mode)
    return result


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(float(x), digits)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                rows.append(json.loads(line))
    return rows


def _process_names(run_dir: Path, trace: Any) -> dict[str, str]:
    """OS pid -> component name, from processes.json, trace.json and controller.pid."""
    names: dict[str, str] = {}
    table = _read_json(run_dir / "processes.json") or {}
    for component, pids in table.items():
        for i, pid in enumerate(pids):
            names[str(pid)] = component if len(pids) == 1 else f"{component} {i}"
    if isinstance(trace, dict):
        for p in (trace.get("otherData") or {}).get("processes", []):
            if p.get("os_pid") is not None:
                names.setdefault(str(p["os_pid"]), str(p["name"]))
    controller = _read_text(run_dir / "controller.pid")
    if controller:
        names.setdefault(controller, "controller")
    return names


def _trace_numbers(trace: dict[str, Any]) -> dict[str, Any]:
    """Busy share per component over the steady state (from the end of the trainer's first
    span to the end of its last: the window async_grpo's utilization report uses), and the
    medians of the trainer's publish and the generators' update_weights spans."""
    other = trace.get("otherData") or {}
    kinds = {int(p["pid"]): str(p["kind"]) for p in other.get("processes", [])}
    spans: list[tuple[int, str, float, float, bool]] = []
    for e in trace.get("traceEvents", []):
        if isinstance(e, dict) and e.get("ph") == "X":
            start = float(e["ts"]) / 1e6
            end = start + float(e.get("dur", 0)) / 1e6
            spans.append((int(e["pid"]), str(e.get("name")), start, end, e.get("cat") == "wait"))
    trainer = sorted(
        end
        for pid, name, _, end, wait in spans
        if kinds.get(pid) == "trainer" and not wait and name != "checkpoint"
    )
    if len(trainer) < 2:
        return {"busy_share": None, "busy_share_note": "fewer than two trainer spans"}
    t0, t1 = trainer[0], trainer[-1]
    per_pid: dict[int, list[tuple[float, float]]] = {}
    for pid, _, start, end, wait in spans:
        if not wait:
            per_pid.setdefault(pid, []).append((start, end))
    shares: dict[str, list[float]] = {}
    for pid, intervals in per_pid.items():
        kind = kinds.get(pid, f"pid {pid}")
        if kind == "controller":
            continue
        busy = sum(max(0.0, min(e, t1) - max(s, t0)) for s, e in _union(intervals))
        shares.setdefault(kind, []).append(busy / (t1 - t0))
    durations: dict[str, list[float]] = {}
    for pid, name, start, end, _ in spans:
        key = f"{kinds.get(pid)}.{name}"
        if key in ("trainer.publish", "generator.update_weights", "trainer.train_step"):
            durations.setdefault(key, []).append((end - start) * 1e3)
    return {
        "steady_window_s": round(t1 - t0, 2),
        "busy_share": {k: round(statistics.mean(v), 3) for k, v in shares.items()},
        "span_ms_median": {k: round(statistics.median(v), 2) for k, v in durations.items()},
    }


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        elif end > start:
            out.append((start, end))
    return out


def _memory(path: Path, names: dict[str, str], mode: str) -> dict[str, Any]:
    rows = _jsonl(path)
    result: dict[str, Any] = {"samples": len(rows)}
    gpu: dict[str, float] = {}
    rss: dict[str, float] = {}
    used, util = [], []
    for row in rows:
        for pid, mib in (row.get("gpu_mib") or {}).items():
            if mib is not None:
                key = names.get(pid, f"other pid {pid}")
                gpu[key] = max(gpu.get(key, 0.0), mib)
        for pid, mib in (row.get("rss_mib") or {}).items():
            key = names.get(pid, f"pid {pid}")
            rss[key] = max(rss.get(key, 0.0), round(mib, 1))
        if row.get("gpu_used_mib") is not None:
            used.append(row["gpu_used_mib"])
        if row.get("gpu_util") is not None:
            util.append(row["gpu_util"])
    if any("gpu_mib" in r for r in rows):
        result["gpu_peak_mib"] = gpu
        result["gpu_used_peak_mib"] = max(used) if used else None
        result["gpu_util_mean_pct"] = round(statistics.mean(util), 1) if util else None
    else:
        result["gpu_peak_mib"] = None
        result["gpu_note"] = (
            "no GPU memory samples: nvidia-smi not found"
            if mode != "cuda"
            else "no GPU memory samples (nvidia-smi missing or silent)"
        )
    result["rss_peak_mib"] = rss
    return result
