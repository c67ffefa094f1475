"""Where a run's CPU goes: each process's CPU time per train step, in the steady state.

On a machine with fewer cores than busy processes, the async loop is bound by the sum of
their work, not by any one of them: every millisecond the controller, the buffer or the
generator spends per step is taken from a core the trainer could use. This runs the tiny
preset (`uv run async-grpo --eval_every 0`, plus any run options after `--`), lets it train
`--warm` steps, then reads every process's CPU time (`/proc/<pid>/stat`: user + system, all
its threads, Monarch's included) before and after the next `--measure` steps, and stops the
run.

    uv run python apps/async_grpo/benchmarks/cpu_per_step.py                 # 100 + 200 steps
    uv run python apps/async_grpo/benchmarks/cpu_per_step.py --quick         # 30 + 60 steps
    uv run python apps/async_grpo/benchmarks/cpu_per_step.py -- --mode sync  # run options

Printed per process (named by the run's `processes.json`; the controller is the run's own
process): CPU milliseconds per step and the share of one core, then the total against the
cores' capacity over the same steps. Linux only (`/proc`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from async_grpo.actors.cores import usable_cpus

POLL_S = 0.05
DEADLINE_S = 600.0


def cpu_ticks(pid: int) -> int:
    """User + system clock ticks of process `pid` so far (every thread)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def trained_steps(out: Path) -> int:
    """The newest step in the run's `metrics.jsonl` (0 before the first)."""
    try:
        lines = (out / "metrics.jsonl").read_text().splitlines()
        return int(json.loads(lines[-1])["version"]) if lines else 0
    except (OSError, ValueError, KeyError):
        return 0  # not written yet, or a line being written


def wait_for_step(out: Path, step: int, run: subprocess.Popen[bytes], deadline: float) -> None:
    while trained_steps(out) < step:
        if run.poll() is not None:
            raise SystemExit(f"the run ended (exit {run.returncode}) before step {step}")
        if time.monotonic() > deadline:
            raise SystemExit(f"no step {step} within {DEADLINE_S:.0f} s")
        time.sleep(POLL_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warm", type=int, default=100, help="steps before measuring")
    parser.add_argument("--measure", type=int, default=200, help="steps measured")
    parser.add_argument("--quick", action="store_true", help="30 + 60 steps")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    parser.add_argument("run_options", nargs="*", help="after --: options of `async-grpo`")
    args = parser.parse_args()
    if not Path("/proc/self/stat").exists():
        raise SystemExit("cpu_per_step.py reads /proc: Linux only")
    warm, measure = (30, 60) if args.quick else (args.warm, args.measure)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        command = [str(Path(sys.executable).with_name("async-grpo")), "--eval_every", "0"]
        command += ["--steps", str(warm + measure + 20), "--out_dir", str(out)]
        command += args.run_options
        run = subprocess.Popen(command, stdout=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + DEADLINE_S
            wait_for_step(out, warm, run, deadline)
            names = {"controller": [run.pid]} | json.loads((out / "processes.json").read_text())
            pids = {
                f"{n} {k}" if len(p) > 1 else n: pid
                for n, p in names.items()
                for k, pid in enumerate(p)
            }
            start, t0, s0 = (
                {n: cpu_ticks(p) for n, p in pids.items()},
                time.monotonic(),
                trained_steps(out),
            )
            wait_for_step(out, warm + measure, run, deadline)
            end, t1, s1 = (
                {n: cpu_ticks(p) for n, p in pids.items()},
                time.monotonic(),
                trained_steps(out),
            )
        finally:
            os.killpg(run.pid, signal.SIGINT)  # the run stops as after Ctrl-C
            try:
                run.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
    hz, steps = os.sysconf("SC_CLK_TCK"), s1 - s0
    wall_ms = 1000 * (t1 - t0) / steps
    rows = {n: 1000 * (end[n] - start[n]) / hz / steps for n in pids}
    print(f"{steps} steps, {wall_ms:.1f} ms a step; CPU ms a step (share of one core):")
    for name, ms in sorted(rows.items(), key=lambda r: -r[1]):
        print(f"  {name:<12} {ms:6.1f} ({ms / wall_ms:4.0%})")
    total, cores = sum(rows.values()), usable_cpus()
    used = total / wall_ms / cores
    print(f"  {'total':<12} {total:6.1f} of {cores * wall_ms:.1f} ({used:.0%} of {cores} cores)")
    if args.json:
        args.json.write_text(
            json.dumps({"ms_per_step": wall_ms, "cpu_ms_per_step": rows}, indent=1)
        )


if __name__ == "__main__":
    main()
