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
    uv run python apps/async_grpo/benchmarks/cpu_per_step.py --compare --rounds 2

Printed per process (named by the run's `processes.json`; the controller is the run's own
process): CPU milliseconds per step and the share of one core, then the total against the
cores' capacity over the same steps. Linux only (`/proc`).

`--compare` runs `--mode sync` and the async default in turn (`--rounds` of each,
alternating which goes first) and prints, from the pooled means, the identity the two step
periods follow: a period is the CPU a step takes over what the cores give it,
P = CPU / (cores x busy share), so async / sync = (CPU sync / CPU async) x (busy async /
busy sync). With every core busy in async (busy share 1), the most async could be here is
P sync / (CPU async / cores): where sync already keeps the cores busy part of the time, and
both modes do the same work a step, that ceiling can sit below what the loop's overlap
alone would allow (2x at `max_policy_age` 1).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from async_grpo.actors.cores import usable_cpus

POLL_S = 0.05
DEADLINE_S = 600.0


@dataclasses.dataclass(frozen=True)
class Reading:
    """One run's steady state: `ms_per_step` (wall ms a train step) and `cpu_ms` (process
    name -> its CPU ms a train step, every thread)."""

    ms_per_step: float
    cpu_ms: dict[str, float]

    @property
    def total(self) -> float:
        """Every process's CPU ms a step, summed."""
        return sum(self.cpu_ms.values())

    def busy(self, cores: int) -> float:
        """The share of `cores` the run kept busy: its CPU over what the cores gave it."""
        return self.total / (self.ms_per_step * cores)


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


def measure(run_options: list[str], warm: int, steps: int) -> Reading:
    """Runs the tiny preset with `run_options`, reads every process's CPU time over the
    `steps` train steps after the first `warm`, and stops the run."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        command = [str(Path(sys.executable).with_name("async-grpo")), "--eval_every", "0"]
        command += ["--steps", str(warm + steps + 20), "--out_dir", str(out), *run_options]
        log = Path(tmp) / "stderr.log"
        with log.open("wb") as err:
            run = subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
            )
        try:
            deadline = time.monotonic() + DEADLINE_S
            wait_for_step(out, warm, run, deadline)
            names = {"controller": [run.pid]} | json.loads((out / "processes.json").read_text())
            pids = {
                f"{n} {k}" if len(p) > 1 else n: pid
                for n, p in names.items()
                for k, pid in enumerate(p)
            }
            start = {n: cpu_ticks(p) for n, p in pids.items()}
            t0, s0 = time.monotonic(), trained_steps(out)
            wait_for_step(out, warm + steps, run, deadline)
            end = {n: cpu_ticks(p) for n, p in pids.items()}
            t1, s1 = time.monotonic(), trained_steps(out)
        except SystemExit:
            # The run's own words say why it ended or stalled (its log is deleted with tmp).
            sys.stderr.write(log.read_text(errors="replace")[-4000:])
            raise
        finally:
            stop(run)
    hz, done = os.sysconf("SC_CLK_TCK"), s1 - s0
    cpu_ms = {n: 1000 * (end[n] - start[n]) / hz / done for n in pids}
    return Reading(1000 * (t1 - t0) / done, cpu_ms)


def stop(run: subprocess.Popen[bytes]) -> None:
    """Stops the run as Ctrl-C would (SIGINT to its process group), killing it after 120 s;
    nothing to do when it already ended."""
    with contextlib.suppress(ProcessLookupError):  # it ended, and its group with it
        os.killpg(run.pid, signal.SIGINT)
    try:
        run.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()


def pooled(readings: list[Reading]) -> Reading:
    """The mean of several runs' readings of one mode (each process's CPU ms a step, and
    the wall ms a step)."""
    names = {n for r in readings for n in r.cpu_ms}
    cpu_ms = {n: statistics.fmean(r.cpu_ms.get(n, 0.0) for r in readings) for n in names}
    return Reading(statistics.fmean(r.ms_per_step for r in readings), cpu_ms)


def print_reading(label: str, reading: Reading, cores: int) -> None:
    wall = reading.ms_per_step
    print(f"{label}: {wall:.1f} ms a step; CPU ms a step (share of one core):")
    for name, ms in sorted(reading.cpu_ms.items(), key=lambda r: -r[1]):
        print(f"  {name:<12} {ms:6.1f} ({ms / wall:4.0%})")
    total = reading.total
    busy = reading.busy(cores)
    print(f"  {'total':<12} {total:6.1f} of {cores * wall:.1f} ({busy:.0%} of {cores} cores)")


def ceiling(sync: Reading, async_: Reading, cores: int) -> float:
    """The most async / sync could be with the measured work: sync's step period over
    async's CPU a step spread over every core."""
    return sync.ms_per_step / (async_.total / cores)


def print_comparison(sync: Reading, async_: Reading, cores: int) -> None:
    ratio = sync.ms_per_step / async_.ms_per_step
    work, busy = sync.total / async_.total, async_.busy(cores) / sync.busy(cores)
    print(
        f"async / sync steps a second: {ratio:.2f}x = CPU a step sync / async "
        f"({sync.total:.1f} / {async_.total:.1f} ms = {work:.2f}) x busy share async / sync "
        f"({async_.busy(cores):.0%} / {sync.busy(cores):.0%} = {busy:.2f})"
    )
    print(
        f"with every core busy in async, at most {ceiling(sync, async_, cores):.2f}x here "
        f"({sync.ms_per_step:.1f} ms / ({async_.total:.1f} ms / {cores} cores))"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warm", type=int, default=100, help="steps before measuring")
    parser.add_argument("--measure", type=int, default=200, help="steps measured")
    parser.add_argument("--quick", action="store_true", help="30 + 60 steps")
    parser.add_argument(
        "--compare", action="store_true", help="sync and async in turn, and their identity"
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="with --compare: runs of each mode (default 1)"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    parser.add_argument("run_options", nargs="*", help="after --: options of `async-grpo`")
    args = parser.parse_args()
    if not Path("/proc/self/stat").exists():
        raise SystemExit("cpu_per_step.py reads /proc: Linux only")
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.rounds > 1 and not args.compare:
        parser.error("--rounds counts the runs of each mode of --compare: add --compare")
    if args.warm < 1 or args.measure < 1:
        # The run's processes are named once it has trained a step, and a reading needs one.
        parser.error(f"--warm and --measure must be at least 1, got {args.warm}, {args.measure}")
    if args.compare and any(o.split("=")[0] == "--mode" for o in args.run_options):
        parser.error("--compare runs both modes: leave --mode out of the run options")
    warm, steps = (30, 60) if args.quick else (args.warm, args.measure)
    cores = usable_cpus()
    if not args.compare:
        reading = measure(args.run_options, warm, steps)
        print_reading(f"{steps} steps", reading, cores)
        if args.json:
            row = {"ms_per_step": reading.ms_per_step, "cpu_ms_per_step": reading.cpu_ms}
            args.json.write_text(json.dumps(row, indent=1))
        return
    runs: dict[str, list[Reading]] = {"sync": [], "async": []}
    for i in range(args.rounds):
        for mode in ("sync", "async") if i % 2 == 0 else ("async", "sync"):
            reading = measure([*args.run_options, "--mode", mode], warm, steps)
            runs[mode].append(reading)
            print_reading(f"{mode} (round {i}, {steps} steps)", reading, cores)
    sync, async_ = pooled(runs["sync"]), pooled(runs["async"])
    if args.rounds > 1:
        print_reading("sync, mean of the rounds", sync, cores)
        print_reading("async, mean of the rounds", async_, cores)
    print_comparison(sync, async_, cores)
    if args.json:
        rows = [
            {
                "mode": mode,
                "ms_per_step": r.ms_per_step,
                "cpu_ms_per_step": r.cpu_ms,
                "busy": r.busy(cores),
                "cores": cores,
                "runs_ms_per_step": [x.ms_per_step for x in runs[mode]],
            }
            for mode, r in (("sync", sync), ("async", async_))
        ]
        args.json.write_text(json.dumps({"rows": rows, "ceiling": ceiling(sync, async_, cores)}))


if __name__ == "__main__":
    main()
