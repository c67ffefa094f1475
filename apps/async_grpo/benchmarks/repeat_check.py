"""Does a sync run repeat bit for bit? Runs `async-grpo --mode sync` with a fixed seed as its
own process and keeps everything of its metrics that does not depend on the clock: per step
the rewards, loss, KL, clip fraction, gradient norm, learning rate, entropy, staleness and
episode counts, and the prompts each step trained on (`trained_prompts.jsonl`).

    uv run python apps/async_grpo/benchmarks/repeat_check.py --save before.json
    # ... change the code ...
    uv run python apps/async_grpo/benchmarks/repeat_check.py --against before.json

`--against` exits 1 and names the first step and field that differ. Floats are compared as
they were written (JSON's shortest repr round-trips a float64 exactly), so "equal" means
bit for bit. Any other option is passed to the run (e.g. `--steps 60 --seed 3`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# Fields of a metrics row that depend on the clock (or on which process answered first).
TIMED = frozenset(
    {
        "wall_s",
        "episodes_per_s",
        "tokens_per_s",
        "trainer_idle_frac",
        "weight_sync_s",
        "weight_pull_s",
        "checkpoint_s",
        "replica_down_s",
        "restore_s",
        "weight_sync_transport",
    }
)
DEFAULT_RUN = ["--steps", "40", "--seed", "3", "--eval_every", "0", "--trace", "false"]


def fingerprint(run_args: list[str]) -> dict[str, Any]:
    """Runs the command in a temporary directory and returns its clock-free metrics."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = ["async-grpo", "--mode", "sync", *run_args, "--out_dir", str(out)]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        prompts = (out / "trained_prompts.jsonl").read_text().splitlines()
    return {
        "command": " ".join(cmd[:-2]),
        "steps": [{k: v for k, v in row.items() if k not in TIMED} for row in rows],
        "trained_prompts": prompts,
    }


def first_difference(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """Where two fingerprints first differ, in words; None when they are equal."""
    if len(a["steps"]) != len(b["steps"]):
        return f"{len(a['steps'])} steps vs {len(b['steps'])}"
    for row_a, row_b in zip(a["steps"], b["steps"], strict=True):
        for key in sorted(set(row_a) | set(row_b)):
            if row_a.get(key) != row_b.get(key):
                step = row_a.get("version")
                return f"step {step}: {key} {row_a.get(key)!r} vs {row_b.get(key)!r}"
    for k, (pa, pb) in enumerate(zip(a["trained_prompts"], b["trained_prompts"], strict=True)):
        if pa != pb:
            return f"trained_prompts line {k + 1}: {pa} vs {pb}"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", type=Path, help="write the fingerprint here")
    parser.add_argument("--against", type=Path, help="compare with a saved fingerprint")
    args, run_args = parser.parse_known_args()
    got = fingerprint(run_args or DEFAULT_RUN)
    print(f"{got['command']}: {len(got['steps'])} steps")
    if args.save:
        args.save.write_text(json.dumps(got, indent=1))
        print(f"saved {args.save}")
    if args.against:
        saved = json.loads(args.against.read_text())
        if saved["command"] != got["command"]:
            print(f"note: saved with {saved['command']!r}")
        diff = first_difference(saved, got)
        if diff is not None:
            print(f"DIFFERENT: {diff}")
            return 1
        print(f"bit-identical to {args.against}: every clock-free metric of every step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
