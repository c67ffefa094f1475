"""What tracing costs, in ONE run of this script: trained episodes/s with `--trace` on and off.

Runs the tiny preset (async, same seed) alternately with tracing off and on, `--pairs`
times each, so slow drifts of a shared machine hit both settings alike; prints every run,
the median of each setting and the ratio on/off. The goal is a ratio >= 0.98 (at most 2%
slower); tracing is on by default only because it meets it. Rates are measured from the end
of the first train step (start-up excluded), as the app reports them.

On a shared machine the run-to-run spread of episodes/s can exceed 2%, so the script also
gives a bound that noise does not blur: the cost of one span measured here (recording it,
and later encoding and writing it) times the spans per second a traced run recorded, as a
share of one core.

    uv run python apps/async_grpo/benchmarks/trace_overhead.py            # 3 pairs, 150 steps
    uv run python apps/async_grpo/benchmarks/trace_overhead.py --quick --json out.json

`--json PATH` writes {"runs": [{"trace", "episodes_per_s", "wall_s"}...], "ratio"}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from async_grpo import tracing
from async_grpo.actors.cores import usable_cpus
from async_grpo.config.args import apply_overrides
from async_grpo.config.presets import tiny
from async_grpo.launch.prepare import prepare
from async_grpo.observability.console import Summary
from async_grpo.train import run


def bench(trace: bool, steps: int, seed: int, out: Path) -> Summary:
    cfg = apply_overrides(
        tiny(),
        {"steps": str(steps), "seed": str(seed), "trace": str(trace), "out_dir": str(out)},
    )
    return asyncio.run(run(cfg, prepare(cfg), quiet=True))


def span_cost_us(n: int = 200_000) -> tuple[float, float]:
    """Microseconds of CPU per span with tracing off and on (recording, encoding, writing)."""

    def loop() -> float:
        start = time.process_time()
        for i in range(n):
            with tracing.span("step", version=i):
                pass
        tracer = tracing.active()
        if tracer is not None:
            tracer.flush()
        return (time.process_time() - start) / n * 1e6

    tracing.stop()
    off = loop()
    with tempfile.TemporaryDirectory() as tmp:
        tracing.start(Path(tmp), "bench")
        on = loop()
        tracing.stop()
    return off, on


def spans_per_s(trace_json: Path) -> float:
    """Spans of every process per second of the run, from a merged trace."""
    events = [e for e in json.loads(trace_json.read_text())["traceEvents"] if e["ph"] == "X"]
    end = max(e["ts"] + e["dur"] for e in events)
    start = min(e["ts"] for e in events)
    return len(events) / max(1e-9, (float(end) - float(start)) / 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="1 pair of 40 steps")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    steps, pairs = (40, 1) if args.quick else (args.steps, args.pairs)
    print(f"tiny preset, {steps} train steps per run, {pairs} off/on pairs, {usable_cpus()} CPUs")
    runs: list[dict[str, object]] = []
    rates: dict[bool, list[float]] = {False: [], True: []}
    density: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(pairs):
            for trace in (False, True):
                s = bench(trace, steps, args.seed, Path(tmp) / f"{i}-{trace}")
                if trace and not (Path(tmp) / f"{i}-{trace}" / "trace.json").exists():
                    raise SystemExit("a traced run wrote no trace.json")
                if trace:
                    density.append(spans_per_s(Path(tmp) / f"{i}-{trace}" / "trace.json"))
                rates[trace].append(s.episodes_per_s)
                runs.append(
                    {"trace": trace, "episodes_per_s": s.episodes_per_s, "wall_s": s.wall_s}
                )
                print(
                    f"trace {'on ' if trace else 'off'}: {s.episodes_per_s:7.1f} "
                    f"trained episodes/s ({s.wall_s:.0f} s wall)"
                )
    off, on = statistics.median(rates[False]), statistics.median(rates[True])
    ratio = on / max(off, 1e-9)
    print(f"median episodes/s: off {off:.1f}, on {on:.1f}; on/off {ratio:.3f} (goal >= 0.98)")
    cost_off, cost_on = span_cost_us()
    rate = statistics.median(density)
    share = rate * (cost_on - cost_off) / 1e6
    print(
        f"one span: {cost_off:.2f} us off, {cost_on:.2f} us on; a traced run records "
        f"{rate:.0f} spans/s over all its processes: {share:.3%} of one core"
    )
    if args.json:
        out = {"runs": runs, "ratio": ratio, "span_us": [cost_off, cost_on], "spans_per_s": rate}
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
