"""Async vs sync GRPO on the tiny preset, in ONE run: trained episodes/s and trainer idle time.

Both modes run the same loop with the same preset and seed; sync is `--mode sync` (one
batch of prompts per version, generated on that version's weights, while the trainer
waits). Rates are measured from the end of the first train step (start-up excluded);
`trained_frac` is the share of the generated episodes that were trained.

    uv run python apps/async_grpo/benchmarks/async_vs_sync.py            # 120 steps each
    uv run python apps/async_grpo/benchmarks/async_vs_sync.py --quick --json out.json
    uv run python apps/async_grpo/benchmarks/async_vs_sync.py -- --trainer.batch_size 256

Run options after `--` (`async-grpo`'s own, except those this script sets: `--mode`,
`--steps`, `--seed`, `--out_dir`, `--nice`, `--device`) change the preset for both modes.

`--rounds N` runs each mode N times, alternating the order (sync then async, async then
sync, ...), and pools each mode's runs: on a shared machine whose speed drifts over minutes
two pairs of the same code read 1.28x and 1.81x (measured, 2-core VM), and alternating cancels
a steady drift. A mode's episodes/s is then the harmonic mean of its runs' (they train the
same number of episodes), the other columns the mean.

`--json PATH` writes rows {"mode", "episodes_per_s", "trainer_idle_frac", "trainer_busy",
"trained_frac", "final_reward", "final_eval", "nice", "runs_episodes_per_s"}: `final_reward`
is the reward of the last 64 generated episodes (it swings by about 0.15 from step to step),
`final_eval` the final weights' score on the preset's fixed evaluation set (it does not).
`--nice N` runs both modes with the run option `--nice N` (the preset's 10 by default; 0:
the other processes at the trainer's priority). `--device cpu` keeps every process on the
CPU where `auto` would put the models on a GPU: on the GPU machine, its 16 cores
(`tools/gpu_check.sh`'s `async_vs_sync` part).

Then, from each run's trace, where the batch cycle goes (`observability/report/cycle.py`):
from the end of the step that makes version v to the start of the step that trains on v's
episodes, segment by segment, in mean ms a cycle over each mode's runs (the first tenth of
each run's steps left out), and the identity the step period follows, (C + T) / (a + 1).
The JSON rows gain "cycle_ms" (segment -> ms), "train_ms" and "period_ms".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from async_grpo.actors.cores import usable_cpus
from async_grpo.config.args import apply_overrides, parse
from async_grpo.config.presets import tiny
from async_grpo.config.schema import ConfigError, RunConfig
from async_grpo.config.validate import validate
from async_grpo.observability.report.cycle import SEGMENTS, Cycles
from async_grpo.observability.report.run_dir import load_run, run_cycles

if TYPE_CHECKING:
    from async_grpo.observability.console import Summary


SET_HERE = ("--mode", "--steps", "--seed", "--out_dir", "--nice", "--device")
"""Run options this script sets itself: not taken after `--`."""


def base_config(run_options: list[str]) -> RunConfig:
    """The tiny preset with `run_options` (`--section.field value`) applied: what both modes
    run. Raises `ConfigError` naming a bad option, or one this script sets itself."""
    cfg = parse(run_options, tiny(), reserved=SET_HERE)
    validate(cfg)
    return cfg


def bench(
    base: RunConfig,
    mode: str,
    steps: int,
    seed: int,
    out: Path,
    *,
    nice: int | None,
    device: str | None,
) -> Summary:
    # Imported here, not at the top: `--help` answers without the seconds they take.
    from async_grpo.launch.prepare import prepare  # noqa: PLC0415
    from async_grpo.train import run  # noqa: PLC0415

    overrides = {"mode": mode, "steps": str(steps), "seed": str(seed), "out_dir": str(out)}
    if nice is not None:
        overrides["nice"] = str(nice)
    if device is not None:
        overrides["device"] = device
    cfg = apply_overrides(base, overrides)
    return asyncio.run(run(cfg, prepare(cfg), quiet=True))


def trained_frac(summary: Summary) -> float:
    """Trained / generated episodes of a run."""
    m = summary.metrics
    return m.episodes_trained / m.episodes_generated if m.episodes_generated else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="30 steps per mode")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--rounds", type=int, default=1, help="runs per mode, in alternating order (default 1)"
    )
    parser.add_argument(
        "--nice", type=int, default=None, help="the run's --nice (default: the preset's, 10)"
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cuda", "cpu"),
        default=None,
        help="the runs' --device (default: the preset's, auto); cpu on a GPU machine measures "
        "its CPU cores",
    )
    parser.add_argument(
        "run_options", nargs="*", help="after --: options of `async-grpo` for both modes"
    )
    args = parser.parse_args()
    try:
        base = base_config(args.run_options)
    except ConfigError as e:
        parser.error(f"run options: {e}")
    if args.nice is not None and not 0 <= args.nice <= 19:
        parser.error(f"--nice must be in 0..19 (a Linux nice value), got {args.nice}")
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    steps = 30 if args.quick else args.steps
    nice = tiny().nice if args.nice is None else args.nice
    print(
        f"tiny preset, {steps} train steps per run, {args.rounds} run(s) per mode, "
        f"seed {args.seed}, nice {nice}, device {args.device or tiny().device}, "
        f"{usable_cpus()} CPUs"
        + (f", run options {' '.join(args.run_options)}" if args.run_options else "")
    )
    runs: dict[str, list[Summary]] = {"sync": [], "async": []}
    cycles: dict[str, list[Cycles]] = {"sync": [], "async": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            for mode in ("sync", "async") if i % 2 == 0 else ("async", "sync"):
                out = Path(tmp) / f"{mode}-{i}"
                runs[mode].append(
                    bench(base, mode, steps, args.seed, out, nice=nice, device=args.device)
                )
                found = run_cycles(load_run(out))
                if found is None:
                    print(f"{mode} run {i}: no cycle (no trace, or batches younger than the bound)")
                else:
                    cycles[mode].append(found)
    print(
        f"{'mode':6} {'round':>5} {'episodes/s':>11} {'trainer idle':>13} "
        f"{'trained/generated':>18} {'final reward':>13} {'final eval':>11} {'wall s':>7}"
    )
    for mode, summaries in runs.items():
        for i, r in enumerate(summaries):
            print(
                f"{mode:6} {i:5} {r.episodes_per_s:11.1f} {r.trainer_idle_frac:13.1%} "
                f"{trained_frac(r):18.1%} {r.reward_end:13.3f} {_score(r.eval_end):>11} "
                f"{r.wall_s:7.0f}"
            )
    rows = [pooled(mode, summaries, nice) for mode, summaries in runs.items()]
    if args.rounds > 1:
        for row in rows:
            print(
                f"{row['mode']:6} {'all':>5} {row['episodes_per_s']:11.1f} "
                f"{row['trainer_idle_frac']:13.1%} {row['trained_frac']:18.1%} "
                f"{row['final_reward']:13.3f} {_score(row['final_eval']):>11}"
            )
    sync, async_ = (pooled_rate(runs[mode]) for mode in ("sync", "async"))
    print(f"async / sync episodes/s: {async_ / max(sync, 1e-9):.2f}x")
    pooled_cycles = {mode: pool_cycles(found) for mode, found in cycles.items() if found}
    if len(pooled_cycles) == 2:
        print_cycles(pooled_cycles["sync"], pooled_cycles["async"])
        for row in rows:
            row.update(cycle_row(pooled_cycles[str(row["mode"])]))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


def pool_cycles(found: list[Cycles]) -> Cycles:
    """One mode's cycles over its runs: each mean weighted by its run's cycles."""
    n = sum(c.count for c in found)

    def mean(values: list[float]) -> float:
        return sum(v * c.count for v, c in zip(values, found, strict=True)) / n

    segments = tuple(mean([c.segments_ms[i] for c in found]) for i in range(len(SEGMENTS)))
    return Cycles(
        found[0].age,
        n,
        segments,
        sum(segments),
        mean([c.train_ms for c in found]),
        mean([c.period_ms for c in found]),
    )


def print_cycles(sync: Cycles, async_: Cycles) -> None:
    """The batch cycle's segments side by side, and the step period they make."""
    print(
        f"batch cycle, mean ms ({sync.count} sync and {async_.count} async cycles): from the "
        "step that makes v to the step that trains on v's episodes"
    )
    print(f"{'':22} {'sync':>7} {'async':>7} {'async/sync':>11}")
    lines = [
        (name, a, b)
        for (name, _), a, b in zip(SEGMENTS, sync.segments_ms, async_.segments_ms, strict=True)
    ]
    lines += [
        ("cycle C", sync.cycle_ms, async_.cycle_ms),
        ("train step T", sync.train_ms, async_.train_ms),
    ]
    for name, a, b in lines:
        print(f"{name:22} {a:7.2f} {b:7.2f} {_times(b, a):>11}")
    for c, mode in ((sync, "sync"), (async_, "async")):
        print(
            f"{mode} step period {c.period_ms:.2f} ms = (C + T) / {c.age + 1} = "
            f"{(c.cycle_ms + c.train_ms) / (c.age + 1):.2f} ms"
        )


def cycle_row(c: Cycles) -> dict[str, object]:
    """A mode's cycle for its JSON row."""
    return {
        "cycle_ms": dict(zip((name for name, _ in SEGMENTS), c.segments_ms, strict=True)),
        "train_ms": c.train_ms,
        "period_ms": c.period_ms,
    }


def _times(num: float, den: float) -> str:
    return f"{num / den:.2f}x" if den > 0 else "-"


def pooled_rate(summaries: list[Summary]) -> float:
    """Trained episodes/s over a mode's runs: each trains the same number of episodes, so
    the harmonic mean of their rates."""
    return statistics.harmonic_mean([r.episodes_per_s for r in summaries])


def pooled(mode: str, summaries: list[Summary], nice: int) -> dict[str, object]:
    """One mode's JSON row from its runs (see the module docstring)."""
    idle = statistics.fmean(r.trainer_idle_frac for r in summaries)
    evals = [r.eval_end for r in summaries if r.eval_end is not None]
    return {
        "mode": mode,
        "episodes_per_s": pooled_rate(summaries),
        "trainer_idle_frac": idle,
        "trainer_busy": 1.0 - idle,
        "trained_frac": statistics.fmean(trained_frac(r) for r in summaries),
        "final_reward": statistics.fmean(r.reward_end for r in summaries),
        "final_eval": statistics.fmean(evals) if evals else None,
        "nice": nice,
        "runs_episodes_per_s": [r.episodes_per_s for r in summaries],
    }


def _score(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else "-"


if __name__ == "__main__":
    main()
