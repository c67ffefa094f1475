"""The GPU check's short table: a report (`gpu_check_report.summarize`'s dict, or the
`gpu_check.json` it writes) as one line a part, each part's own figures in that line, then
the gpu tests, the app's peak memory and why a part failed. Formatting only: it reads no
file.
"""

from __future__ import annotations

from typing import Any


def print_table(report: dict[str, Any]) -> None:
    parts = report["parts"]
    print(f"\n== gpu_check: {report['label']} ==")
    m = report["machine"]
    versions = m.get("versions") or {}
    gpu = m.get("gpu") or {}
    print(
        f"python {m.get('python')}, torch {versions.get('torch')}, transformers "
        f"{versions.get('transformers')}, torchmonarch {versions.get('torchmonarch')}, "
        f"GPU: {gpu.get('name', 'none')}, {m.get('cpus')} CPUs"
    )
    print(f"{'part':<13} {'status':<10} {'seconds':>8}  result")
    for name, p in parts.items():
        print(f"{name:<13} {p['status']:<10} {p.get('seconds', 0):>8.1f}  {_one_line(name, p)}")
    for t in parts["gpu_tests"]["tests"]:
        note = f"  ({t['message']})" if t["message"] and t["outcome"] != "passed" else ""
        print(f"    {t['outcome']:<8} {t['id']}{note}")
    app = parts["app"].get("result") or {}
    memory = app.get("memory") or {}
    for title, key in (("peak GPU MiB", "gpu_peak_mib"), ("peak RSS MiB", "rss_peak_mib")):
        values = memory.get(key)
        if values:
            print(f"    {title}: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(values.items())))
    if memory.get("gpu_note"):
        print(f"    {memory['gpu_note']}")
    for name, p in parts.items():
        if p.get("reason"):
            print(f"    {name}: {p['reason']}")
    verdict = "ok" if report["ok"] else "FAILED: " + ", ".join(report["failed"])
    print(f"wall {report['wall_s']} s; {verdict}")


def _one_line(name: str, p: dict[str, Any]) -> str:
    if name == "setup":
        env = p.get("environment") or {}
        actor = env.get("actor") or {}
        problems = env.get("problems") or []
        unmet = env.get("unmet_requirements") or []
        text = f"imports {'ok' if not problems else 'FAILED'}; one actor spawned in "
        text += f"{actor.get('seconds')} s" if actor else "- (failed)"
        if unmet:
            text += f"; unmet wheel requirements: {len(unmet)}"
        return text
    if name == "gpu_tests":
        tests = p.get("tests") or []
        counts: dict[str, int] = {}
        for t in tests:
            counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
        reasons = sorted({t["message"] for t in tests if t["outcome"] == "skipped"})
        text = f"{len(tests)} gpu-marked: " + ", ".join(f"{v} {k}" for k, v in counts.items())
        return text + (f" ({'; '.join(reasons)})" if reasons else "")
    if name == "weight_sync":
        r = p.get("result")
        if not r:
            return "-"
        med, ratios = r["median_s"], r["ratios"]
        text = f"[{r['device']}] {r['arch']} {r['bytes'] / 1e6:.1f} MB: sync "
        text += f"{med['sync'] * 1e3:.1f} ms, stall {med['stall'] * 1e3:.1f} ms, pull "
        text += f"{med['pull'] * 1e3:.1f} ms"
        if r.get("pull_source_pinned") is not None:
            text += " (pinned)" if r["pull_source_pinned"] else " (pageable)"
        text += f", d2d {med['d2d'] * 1e3:.2f} ms, "
        text += f"sync/d2d {ratios['sync_over_d2d']:.1f}x"
        if "cuda_ipc" in med:
            text += f", cuda_ipc {med['cuda_ipc'] * 1e3:.1f} ms"
        else:
            text += " (cuda_ipc skipped: no CUDA device)"
        return text + ("" if r["bit_for_bit"] else ", NOT bit for bit")
    if name == "async_vs_sync":
        r = p.get("result") or {}
        every, two = (_modes_line(r.get(k)) for k in ("all_cpus", "two_cpus"))
        return f"[the tiny preset, all CPUs] {every}; [2 CPUs] {two}"
    r = p.get("result")
    if not r or "steps" not in r:
        return "-"
    busy = r.get("busy_share") or {}
    spans = r.get("span_ms_median") or {}
    text = f"{r.get('label') or ''} {r['steps']} steps: step {_fmt(r['step_s_median'], 3)} s, "
    text += f"{_fmt(r['tokens_per_s'], 0)} tok/s, sync {_fmt(r['weight_sync_ms_median'], 1)} ms "
    text += f"(pull {_fmt(spans.get('generator.update_weights'), 1)} ms, publish "
    text += f"{_fmt(spans.get('trainer.publish'), 1)} ms), busy "
    text += " ".join(f"{k} {v:.0%}" for k, v in busy.items() if k in ("trainer", "generator"))
    held = r.get("checkpoint_held_s") or []
    text += f", {len(held)} checkpoints during the run"
    text += f" (held at most {max(held):.2f} s)" if held else ""
    text += f", reward {_fmt(r['reward_first'], 3)} -> {_fmt(r['reward_last'], 3)}"
    return text + (" (moved)" if r["reward_moved"] else " (did not move)")


def _modes_line(rows: Any) -> str:
    """The benchmark's two JSON rows (`benchmarks/async_vs_sync.py`) in one line."""
    if not isinstance(rows, list):
        return "-"
    by = {r.get("mode"): r for r in rows if isinstance(r, dict)}
    sync, async_ = by.get("sync"), by.get("async")
    if sync is None or async_ is None:
        return "-"
    ratio = async_["episodes_per_s"] / sync["episodes_per_s"] if sync["episodes_per_s"] else None
    text = f"sync {sync['episodes_per_s']:.1f} episodes/s, "
    text += f"async {async_['episodes_per_s']:.1f} ({_fmt(ratio, 2)}x), async trainer idle "
    text += f"{async_['trainer_idle_frac']:.1%}, trained/generated {async_['trained_frac']:.1%}"
    if "cycle_ms" in sync and "cycle_ms" in async_:
        cycles = (sum(r["cycle_ms"].values()) for r in (sync, async_))
        text += ", C/T sync {:.2f}/{:.2f} ms, async {:.2f}/{:.2f}".format(
            next(cycles), sync["train_ms"], next(cycles), async_["train_ms"]
        )
    return text


def _fmt(x: float | None, digits: int) -> str:
    return "-" if x is None else f"{x:.{digits}f}"
