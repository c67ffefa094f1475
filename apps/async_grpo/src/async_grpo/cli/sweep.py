"""`async-grpo sweep`: the same job from fully synchronous to asynchronous, one report.

Runs the job once per staleness bound (`max_policy_age` 0, 1, 2, 4 by default; 0 is
`--mode sync`: one batch of prompts per version, generated on that version's weights), each
into `<out_dir>/age-<K>/` with its metrics,
trace and `config.json`, one after another so they do not compete for the cores; then
writes `<out_dir>/sweep.json` and `<out_dir>/report.html`, whose slider moves between the
recorded runs.

    uv run async-grpo sweep                                  # tiny preset, 200 steps per run
    uv run async-grpo sweep --ages 0,1,8 --steps 400 --out_dir runs/my-sweep
    uv run async-grpo sweep --preset qwen2.5-0.5b --model /path/to/Qwen2.5-0.5B-Instruct

Every option of a training run applies to every run of the sweep (except `--mode` and
`--buffer.max_policy_age`, which the sweep sets).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from async_grpo.config.args import build_config, take_flag
from async_grpo.config.schema import ConfigError, RunConfig
from async_grpo.config.validate import validate
from async_grpo.controller.job import Spawn
from async_grpo.launch.prepare import prepare
from async_grpo.launch.signals import run_watched
from async_grpo.launch.spawn import spawn_components
from async_grpo.train import run

DEFAULT_AGES = (0, 1, 2, 4)
DEFAULT_STEPS = 200
DEFAULT_OUT = "runs/sweep"


@dataclasses.dataclass(frozen=True)
class SweepRun:
    """One finished run of a sweep: its bound, directory, trained episodes/s, trainer idle
    share and final windowed reward (as the run's summary gives them)."""

    max_policy_age: int
    out_dir: Path
    episodes_per_s: float
    trainer_idle_frac: float
    reward_end: float


def parse_ages(raw: str) -> tuple[int, ...]:
    """ "0,1,2,4" -> (0, 1, 2, 4): distinct integers >= 0, at least two, in the given order."""
    try:
        ages = tuple(int(a) for a in raw.split(","))
    except ValueError:
        raise ConfigError(f"--ages: expected integers like 0,1,2,4, got {raw!r}") from None
    if len(ages) < 2 or len(set(ages)) != len(ages) or min(ages) < 0:
        raise ConfigError(f"--ages: need at least two distinct values >= 0, got {raw!r}")
    return ages


def configs(base: RunConfig, ages: Sequence[int], root: Path) -> list[RunConfig]:
    """One config per bound, each validated (so bad input fails before any run starts)."""
    out = []
    for age in ages:
        cfg = copy.deepcopy(base)
        # 0 is sync: one batch of prompts per version, generated on that version's weights.
        cfg.mode = "sync" if age == 0 else "async"
        cfg.buffer.max_policy_age = age
        cfg.out_dir = str(root / f"age-{age}")
        validate(cfg)
        out.append(cfg)
    return out


def sweep(
    base: RunConfig,
    ages: Sequence[int],
    root: Path,
    log: Callable[[str], None] = print,
    *,
    spawn: Spawn = spawn_components,
) -> list[SweepRun]:
    """Runs `base` once per bound in `ages` into `root/age-<K>`, writes `root/sweep.json`
    after each run (so a sweep cut short still has a report of the runs it finished), and
    returns the runs."""
    cfgs = configs(base, ages, root)
    root.mkdir(parents=True, exist_ok=True)
    done: list[SweepRun] = []
    for cfg in cfgs:
        age = cfg.buffer.max_policy_age
        log(f"sweep: max_policy_age {age} -> {cfg.out_dir}")
        prep = prepare(cfg)
        summary = run_watched(run(cfg, prep, quiet=True, spawn=spawn))
        done.append(
            SweepRun(
                age,
                Path(cfg.out_dir),
                summary.episodes_per_s,
                summary.trainer_idle_frac,
                summary.reward_end,
            )
        )
        log(
            f"sweep: max_policy_age {age}: {summary.episodes_per_s:.0f} trained episodes/s, "
            f"trainer idle {summary.trainer_idle_frac:.0%}, final reward {summary.reward_end:.3f}"
        )
        manifest = {
            "runs": [{"dir": r.out_dir.name, "max_policy_age": r.max_policy_age} for r in done]
        }
        (root / "sweep.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return done


def main(argv: list[str], *, spawn: Spawn = spawn_components) -> int:
    """`async-grpo sweep [--ages 0,1,2,4] [run options]`: exit status 0, 2 on bad input (one
    line on stderr, nothing run), 130 when interrupted. `spawn` starts each run's processes."""
    # plotly is imported only here, when the report is written
    from async_grpo.observability.report.build import write_report  # noqa: PLC0415

    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    try:
        raw_ages, rest = take_flag(list(argv), "--ages")
        ages = parse_ages(raw_ages) if raw_ages is not None else DEFAULT_AGES
        for flag in ("--mode", "--buffer.max_policy_age"):
            if take_flag(rest, flag)[0] is not None:
                raise ConfigError(f"{flag}: the sweep sets it for each run; use --ages")
        out_dir, rest = take_flag(rest, "--out_dir")
        steps, rest = take_flag(rest, "--steps")
        rest += ["--out_dir", out_dir or DEFAULT_OUT, "--steps", steps or str(DEFAULT_STEPS)]
        base = build_config(rest)
        root = Path(base.out_dir)
        configs(base, ages, root)
    except (ValueError, OSError) as e:
        print(f"async-grpo sweep: error: {e}", file=sys.stderr)
        return 2
    try:
        sweep(base, ages, root, spawn=spawn)
    except KeyboardInterrupt:
        print("\nasync-grpo sweep: interrupted; the report covers the finished runs.")
        if (root / "sweep.json").exists():
            print(f"report: {write_report(root)}")
        return 130
    print(f"report: {write_report(root)}")
    return 0
