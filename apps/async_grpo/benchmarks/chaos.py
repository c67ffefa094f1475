"""Chaos: the tiny preset run while a schedule of kills hits its processes, against the
same run left alone.

    uv run python apps/async_grpo/benchmarks/chaos.py --json chaos.json
    uv run python apps/async_grpo/benchmarks/chaos.py --quick       # 500 steps, 8 kills
    uv run python apps/async_grpo/benchmarks/chaos.py --quick --signal ABRT -- --trainer.procs 2

Both runs are `async-grpo --preset tiny` as their own process (the same seed, a checkpoint
every `--every` steps, Monarch's supervision poll at 1 s for both, and any `async-grpo`
options after `--`). During the chaos run this script kills, from outside and by pid, a
generator, a reward, the buffer and the trainer process in turn (`--kills` in all; a
sharded trainer's ranks in turn), each once the run has trained `--gap` more steps and the
process killed before is back, with `--signal` (SIGKILL; ABRT or SEGV, as a native
library's failure ends a process, which then writes its stacks first); it reads the pids
from the run's `processes.json`. Then it reads what each run wrote:

- `kills`: signals sent; `recovered`: those the run reported back (a `... is back` line
  for the kind after the death line); `crash_stacks`: the killed processes that left
  their stacks in `<out_dir>/crashes/` and were named in their death's line (0 under
  SIGKILL, which nothing can catch);
- `episodes_lost`: episodes generated and then lost to a failure (the metrics' count);
  `episodes_lost_bound`: the most the kills sent may lose (`recovery.episodes_lost_bound`);
- `prompts_duplicated`: prompt indices trained more than once (`trained_prompts.jsonl`);
- `wall_overhead`: the chaos run's wall time over the clean run's;
- `final_reward`, `final_reward_clean`: the evaluation of each run's final weights (every
  prompt of the eval set, 16 samples each).

Goals (apps/async_grpo/README.md, "Fault tolerance"): every kill recovered, nothing
duplicated, lost episodes within the stated bound, final reward within 0.05 of the clean
run's. Prints one row per run and the goals; `--json` writes the row.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from async_grpo.config.presets import tiny

KINDS = ("generator", "reward", "buffer", "trainer")
BACK = {
    "generator": r"\[generator replica \d+ is back after",
    "reward": r"\[reward replica \d+ is back after",
    "buffer": r"\[buffer replica \d+ is back after",
    "trainer": r"\[trainer is back at version",
}
FINAL_EVAL = re.compile(r"initial weights [\d.]+ -> final ([\d.]+)")
SIGNALS = {"KILL": signal.SIGKILL, "ABRT": signal.SIGABRT, "SEGV": signal.SIGSEGV}
SET_HERE = ("--preset", "--steps", "--checkpoint.every", "--log_every", "--out_dir")
"""Run options this script sets itself: not taken after `--`."""


@dataclasses.dataclass(frozen=True)
class Row:
    """The chaos run against the clean one (see the module docstring)."""

    kills: int
    recovered: int
    crash_stacks: int
    signal: str
    run_options: list[str]
    episodes_lost: int
    episodes_lost_bound: int
    prompts_duplicated: int
    wall_overhead: float
    final_reward: float
    final_reward_clean: float
    kills_by_kind: dict[str, int]
    steps: int
    steps_redone: int
    trainer_restores: int
    replica_down_s: float
    restore_s: float
    wall_s: float
    wall_s_clean: float
    checkpoint_hold_s_mean: float
    step_s_median: float


def start(out: Path, args: argparse.Namespace) -> tuple[subprocess.Popen[str], Path]:
    log = out / "stdout.log"
    cmd = [sys.executable, "-m", "async_grpo.cli", "--preset", "tiny", "--steps", str(args.steps)]
    cmd += ["--checkpoint.every", str(args.every), "--log_every", "100000", "--out_dir", str(out)]
    cmd += args.run_options
    env = {**os.environ, "HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY": "1s"}
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, text=True)
    return proc, log


def rows(out: Path) -> list[dict[str, float]]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def pids(out: Path) -> dict[str, list[int]]:
    try:
        table: dict[str, list[int]] = json.loads((out / "processes.json").read_text())
    except (OSError, ValueError):
        return {}
    return table


def finish(proc: subprocess.Popen[str], began: float, timeout_s: float) -> float:
    code = proc.wait(timeout=timeout_s)
    if code != 0:
        raise SystemExit(f"chaos: a run exited with status {code}")
    return time.perf_counter() - began


def chaos(
    out: Path, args: argparse.Namespace, killed: list[int]
) -> tuple[float, Counter[str], subprocess.Popen[str]]:
    """Runs the chaos run; returns its wall time and the kills sent by kind, and appends
    each process killed to `killed`."""
    began = time.perf_counter()
    proc, _ = start(out, args)
    kills: Counter[str] = Counter()
    progress = 0  # steps trained (rows written, rewinds included) when the last kill landed
    for i in range(args.kills):
        kind = KINDS[i % len(KINDS)]
        # Wait for `gap` more steps and a live process of the kind.
        while True:
            if proc.poll() is not None:
                raise SystemExit(
                    f"chaos: the run ended after {kills.total()} of {args.kills} kills"
                )
            written = len(rows(out))
            target = pids(out).get(kind, [])
            if written >= progress + args.gap and target:
                break
            time.sleep(0.2)
        victim = target[kills[kind] % len(target)]  # a sharded trainer's ranks in turn
        os.kill(victim, SIGNALS[args.signal])
        kills[kind] += 1
        print(f"chaos: SIG{args.signal} {kind} pid {victim} at step {written}", flush=True)
        killed.append(victim)
        # The next kill waits for this process to be replaced (a new pid in the table).
        while proc.poll() is None:
            now = pids(out).get(kind, [])
            if now and victim not in now:
                break
            time.sleep(0.2)
        progress = len(rows(out))
    finish(proc, began, args.timeout)
    return time.perf_counter() - began, kills, proc


def duplicated(out: Path) -> int:
    trained: Counter[int] = Counter()
    for line in (out / "trained_prompts.jsonl").read_text().splitlines():
        trained.update(json.loads(line)["prompts"])
    return sum(1 for count in trained.values() if count > 1)


def crash_stacks(out: Path, log: str, killed: list[int]) -> int:
    """The killed processes whose stacks are in the run's crash folder and whose death's
    line names them."""
    from async_grpo.observability.crashes import read_crashes  # noqa: PLC0415

    return sum(
        1
        for report in read_crashes(out, killed)
        if f"pid {report.pid} crashed in " in log and str(report.path) in log
    )


def final_eval(out: Path) -> float:
    found = FINAL_EVAL.findall((out / "stdout.log").read_text())
    if not found:
        raise SystemExit(f"chaos: no final evaluation in {out / 'stdout.log'}")
    return float(found[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--kills", type=int, default=12)
    parser.add_argument("--every", type=int, default=50, help="checkpoint every N steps")
    parser.add_argument("--gap", type=int, default=40, help="steps between kills")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--quick", action="store_true", help="500 steps, 8 kills, gap 15")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--keep", type=Path, default=None, help="keep both runs' directories here")
    parser.add_argument(
        "--signal", choices=tuple(SIGNALS), default="KILL", help="what each kill sends"
    )
    parser.add_argument(
        "run_options", nargs="*", help="after --: options of `async-grpo` for both runs"
    )
    args = parser.parse_args(argv)
    # Imported here, not at the top: `--help` answers without the seconds they take.
    from async_grpo.config.args import parse  # noqa: PLC0415
    from async_grpo.config.schema import ConfigError  # noqa: PLC0415
    from async_grpo.config.validate import validate  # noqa: PLC0415

    try:
        cfg = parse(args.run_options, tiny(), reserved=SET_HERE)
        validate(cfg)
    except ConfigError as e:
        parser.error(f"run options: {e}")
    if args.quick:
        args.steps, args.kills, args.gap, args.every = 500, 8, 15, 20
    root = args.keep or Path(tempfile.mkdtemp(prefix="chaos-"))
    clean_out, chaos_out = root / "clean", root / "chaos"
    clean_out.mkdir(parents=True, exist_ok=True)
    chaos_out.mkdir(parents=True, exist_ok=True)

    print(f"chaos: the clean run ({args.steps} steps) in {clean_out}", flush=True)
    began = time.perf_counter()
    proc, _ = start(clean_out, args)
    wall_clean = finish(proc, began, args.timeout)
    print(f"chaos: the chaos run ({args.kills} kills) in {chaos_out}", flush=True)
    killed: list[int] = []
    wall, kills, _ = chaos(chaos_out, args, killed)

    log = (chaos_out / "stdout.log").read_text()
    recovered = sum(min(n, len(re.findall(BACK[k], log))) for k, n in kills.items())
    last = rows(chaos_out)[-1]
    steps = sorted(r["wall_s"] for r in rows(chaos_out))
    gaps = sorted(b - a for a, b in itertools.pairwise(steps))
    holds = [r["checkpoint_s"] for r in rows(chaos_out) if r["checkpoint_s"] > 0]
    cfg.checkpoint.every = args.every
    from async_grpo.controller.recovery import episodes_lost_bound  # noqa: PLC0415

    bound = episodes_lost_bound(cfg, buffer_deaths=kills["buffer"], trainer_deaths=kills["trainer"])
    row = Row(
        kills=kills.total(),
        recovered=recovered,
        crash_stacks=crash_stacks(chaos_out, log, killed),
        signal=args.signal,
        run_options=args.run_options,
        episodes_lost=int(last["episodes_lost"]),
        episodes_lost_bound=bound,
        prompts_duplicated=duplicated(chaos_out),
        wall_overhead=wall / wall_clean,
        final_reward=final_eval(chaos_out),
        final_reward_clean=final_eval(clean_out),
        kills_by_kind=dict(kills),
        steps=int(last["version"]),
        steps_redone=int(last["steps_redone"]),
        trainer_restores=int(last["trainer_restores"]),
        replica_down_s=float(last["replica_down_s"]),
        restore_s=float(last["restore_s"]),
        wall_s=wall,
        wall_s_clean=wall_clean,
        checkpoint_hold_s_mean=sum(holds) / max(1, len(holds)),
        step_s_median=gaps[len(gaps) // 2] if gaps else float("nan"),
    )
    print(json.dumps(dataclasses.asdict(row), indent=1))
    goals = {
        "every kill recovered": row.recovered == row.kills,
        "every process killed by a catchable signal left its stacks and was named": (
            row.crash_stacks == (0 if args.signal == "KILL" else row.kills)
        ),
        "no prompt trained twice": row.prompts_duplicated == 0,
        "lost episodes within the bound": row.episodes_lost <= row.episodes_lost_bound,
        "final reward within 0.05 of the clean run's": abs(
            row.final_reward - row.final_reward_clean
        )
        <= 0.05,
    }
    for goal, met in goals.items():
        print(f"{'met' if met else 'MISSED'}: {goal}")
    if args.json is not None:
        args.json.write_text(json.dumps(dataclasses.asdict(row), indent=1))
    return 0 if all(goals.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
