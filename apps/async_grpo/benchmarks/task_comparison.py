"""Which first task learns, and how fast: "count" (one answer), "repeat after me" and
"follow the pattern" (multi-turn), on the tiny model with the same budget and seeds.

Each task runs its preset (`tiny`, `repeat`, `pattern`: the same model, optimizer and batch)
for `--steps` train steps per seed; the evaluation on held-out tasks runs every
`--eval-every` steps. A row per run, then per task the mean over seeds.

    uv run python apps/async_grpo/benchmarks/task_comparison.py               # 3 seeds, 300 steps
    uv run python apps/async_grpo/benchmarks/task_comparison.py --seeds 1 --steps 40 --json out.json
    uv run python apps/async_grpo/benchmarks/task_comparison.py --tasks pattern \
        --set env.credit=episode

`--set KEY=VALUE` (repeatable) overrides a config field of every run, after the preset.

`--json PATH` writes rows {"task", "seed", "eval_start", "eval_end", "eval_reached_09_step",
"reward_end", "episodes_per_s", "wall_s"}.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from async_grpo.actors.cores import usable_cpus
from async_grpo.config.args import apply_overrides
from async_grpo.config.presets import PRESETS
from async_grpo.config.schema import ConfigError

if TYPE_CHECKING:
    from async_grpo.observability.console import Summary

TASKS = {"count": "tiny", "repeat": "repeat", "pattern": "pattern"}


@dataclasses.dataclass(frozen=True)
class Row:
    """One run: the evaluation (mean return on held-out tasks, in [0, 1]) before training
    and at the end, the first step whose evaluation reached 0.9 (None: never), the training
    window's reward at the end, trained episodes per second and wall seconds."""

    task: str
    seed: int
    eval_start: float
    eval_end: float
    eval_reached_09_step: int | None
    reward_end: float
    episodes_per_s: float
    wall_s: float

    @classmethod
    def of(cls, task: str, seed: int, s: Summary) -> Row:
        if s.eval_start is None or s.eval_end is None:
            raise RuntimeError(f"{task} seed {seed}: the run recorded no evaluation")
        return cls(
            task, seed, s.eval_start, s.eval_end, s.eval_reached_09_step, s.reward_end,
            s.episodes_per_s, s.wall_s,
        )  # fmt: skip


def bench(
    task: str, seed: int, steps: int, eval_every: int, out: Path, *, extra: dict[str, str]
) -> Summary:
    overrides = {
        **extra,
        "steps": str(steps),
        "seed": str(seed),
        "model.init_seed": str(seed),
        "eval_every": str(eval_every),
        "max_minutes": "60",
        "trace": "false",
        "out_dir": str(out / f"{task}-{seed}"),
    }
    cfg = apply_overrides(PRESETS[TASKS[task]](), overrides)
    # Imported here, not at the top: `--help` answers without the seconds they take.
    from async_grpo.launch.prepare import prepare  # noqa: PLC0415
    from async_grpo.train import run  # noqa: PLC0415

    return asyncio.run(run(cfg, prepare(cfg), quiet=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated subset")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    bad = [item for item in args.set if "=" not in item]
    if bad:
        parser.error(f"--set takes KEY=VALUE, got {bad[0]!r}")
    extra = dict(item.split("=", 1) for item in args.set)
    for flag in ("steps", "seeds", "eval_every"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1")
    tasks = args.tasks.split(",")
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        parser.error(f"unknown task(s) {unknown}; known: {sorted(TASKS)}")
    for task in tasks:  # a bad --set is refused before the first run, not after it
        try:
            apply_overrides(PRESETS[TASKS[task]](), extra)
        except ConfigError as e:
            parser.error(f"--set: {e}")
    print(
        f"tiny model, {args.steps} train steps, {args.seeds} seed(s) per task, "
        f"eval every {args.eval_every} steps, {usable_cpus()} CPUs"
        + "".join(f", {k}={v}" for k, v in extra.items())
    )
    header = f"{'task':8} {'seed':>4} {'eval start':>10} {'eval end':>9} {'eval>=0.9 at':>13} "
    print(header + f"{'episodes/s':>11} {'wall s':>7}")
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for task in tasks:
            for seed in range(args.seeds):
                summary = bench(task, seed, args.steps, args.eval_every, Path(tmp), extra=extra)
                row = Row.of(task, seed, summary)
                reached = "-" if row.eval_reached_09_step is None else row.eval_reached_09_step
                print(
                    f"{task:8} {seed:4d} {row.eval_start:10.3f} {row.eval_end:9.3f} "
                    f"{reached:>13} {row.episodes_per_s:11.1f} {row.wall_s:7.0f}",
                    flush=True,
                )
                rows.append(row)
    print("mean over seeds:")
    for task in tasks:
        mine = [r for r in rows if r.task == task]
        end = sum(r.eval_end for r in mine) / len(mine)
        hit = [r.eval_reached_09_step for r in mine if r.eval_reached_09_step is not None]
        print(f"  {task:8} final eval {end:.3f}; reached 0.9 in {len(hit)}/{len(mine)} runs {hit}")
    if args.json:
        args.json.write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=2) + "\n")


if __name__ == "__main__":
    main()
