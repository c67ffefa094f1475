"""Async vs sync GRPO on the tiny preset, in ONE run: trained episodes/s and trainer idle time.

Both modes run the same loop with the same preset and seed; sync is `--mode sync` (one
batch of prompts per version, generated on that version's weights, while the trainer
waits). Rates are measured from the end of the first train step (start-up excluded);
`trained_frac` is the share of the generated episodes that were trained.

    uv run python apps/async_grpo/benchmarks/async_vs_sync.py            # 120 steps each
    uv run python apps/async_grpo/benchmarks/async_vs_sync.py --quick --json out.json

`--json PATH` writes rows {"mode", "episodes_per_s", "trainer_idle_frac", "trainer_busy",
"trained_frac", "final_reward", "nice"}. `--nice N` runs both modes with the run option
`--nice N` (the preset's 10 by default; 0: the other processes at the trainer's priority).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from async_grpo.config.args import apply_overrides
from async_grpo.config.presets import tiny

if TYPE_CHECKING:
    from async_grpo.observability.console import Summary


def bench(mode: str, steps: int, seed: int, out: Path, nice: int | None = None) -> Summary:
    # Imported here, not at the top: `--help` answers without the seconds they take.
    from async_grpo.launch.prepare import prepare  # noqa: PLC0415
    from async_grpo.train import run  # noqa: PLC0415

    overrides = {"mode": mode, "steps": str(steps), "seed": str(seed), "out_dir": str(out / mode)}
    if nice is not None:
        overrides["nice"] = str(nice)
    cfg = apply_overrides(tiny(), overrides)
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
        "--nice", type=int, default=None, help="the run's --nice (default: the preset's, 10)"
    )
    args = parser.parse_args()
    if args.nice is not None and not 0 <= args.nice <= 19:
        parser.error(f"--nice must be in 0..19 (a Linux nice value), got {args.nice}")
    steps = 30 if args.quick else args.steps
    nice = tiny().nice if args.nice is None else args.nice
    print(
        f"tiny preset, {steps} train steps per mode, seed {args.seed}, nice {nice}, "
        f"{os.cpu_count()} CPUs"
    )
    with tempfile.TemporaryDirectory() as tmp:
        results = [bench(m, steps, args.seed, Path(tmp), nice) for m in ("sync", "async")]
    rows = [
        {
            "mode": r.mode,
            "episodes_per_s": r.episodes_per_s,
            "trainer_idle_frac": r.trainer_idle_frac,
            "trainer_busy": 1.0 - r.trainer_idle_frac,
            "trained_frac": trained_frac(r),
            "final_reward": r.reward_end,
            "nice": nice,
        }
        for r in results
    ]
    print(
        f"{'mode':6} {'episodes/s':>11} {'trainer idle':>13} {'trained/generated':>18} "
        f"{'final reward':>13} {'wall s':>7}"
    )
    for r in results:
        print(
            f"{r.mode:6} {r.episodes_per_s:11.1f} {r.trainer_idle_frac:13.1%} "
            f"{trained_frac(r):18.1%} {r.reward_end:13.3f} {r.wall_s:7.0f}"
        )
    sync, async_ = results
    print(f"async / sync episodes/s: {async_.episodes_per_s / max(sync.episodes_per_s, 1e-9):.2f}x")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
