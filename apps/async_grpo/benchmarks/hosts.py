"""One host vs three local hosts, the tiny preset: steps/s, weight-sync time and learning.

The same run twice per seed: every component on this host (`--placement.launcher local`,
weights by shared memory), then `placement.three_local_hosts()`: a `ProcessJob` of three
local hosts (trainer on `a`, generators on `b`, the rest on `c`), each host mesh a machine
of its own, so weights go from the trainer to the generators by Monarch RDMA (its TCP
fallback here: no ibverbs on this machine). Rates are measured from the end of the first
train step. Weight sync is the median, over steps, of the controller's wait from handing a
version to the generators to their answer (which includes waiting behind a `generate` call
in progress); pull is the median time a generator spent in `update_weights` itself (its
trace spans), where the transport's cost shows.

    uv run python apps/async_grpo/benchmarks/hosts.py                  # 120 steps, seed 0
    uv run python apps/async_grpo/benchmarks/hosts.py --seeds 0,1,2 --json hosts.json

`--json PATH` writes one row per run: {"placement", "seed", "steps_per_s",
"episodes_per_s", "weight_sync_ms", "pull_ms", "transport", "reward_start", "reward_end",
"eval_start", "eval_end", "wall_s"}.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from async_grpo.actors.cores import usable_cpus
from async_grpo.config.placement import PlacementConfig, three_local_hosts
from async_grpo.config.presets import tiny

PLACEMENTS = {"one host": PlacementConfig(), "three hosts": three_local_hosts()}


def bench(name: str, steps: int, seed: int, out: Path) -> dict[str, Any]:
    # Imported here, not at the top: `--help` answers without the seconds they take.
    from async_grpo.launch.prepare import prepare  # noqa: PLC0415
    from async_grpo.train import run  # noqa: PLC0415

    cfg = dataclasses.replace(tiny(), steps=steps, seed=seed, placement=PLACEMENTS[name])
    cfg.out_dir = str(out / f"{name.replace(' ', '-')}-seed{seed}")
    summary = asyncio.run(run(cfg, prepare(cfg), quiet=True))
    rows = [json.loads(x) for x in Path(cfg.out_dir, "metrics.jsonl").read_text().splitlines()]
    trace = json.loads(Path(cfg.out_dir, "trace.json").read_text())["traceEvents"]
    pulls = [e["dur"] / 1e3 for e in trace if e.get("name") == "update_weights"]
    first, last = rows[0], rows[-1]
    return {
        "placement": name,
        "seed": seed,
        "steps_per_s": (last["version"] - first["version"]) / (last["wall_s"] - first["wall_s"]),
        "episodes_per_s": summary.episodes_per_s,
        "weight_sync_ms": 1e3 * statistics.median(r["weight_sync_s"] for r in rows[1:]),
        "pull_ms": statistics.median(pulls),
        "transport": last["weight_sync_transport"],
        "reward_start": summary.reward_start,
        "reward_end": summary.reward_end,
        "eval_start": summary.eval_start,
        "eval_end": summary.eval_end,
        "wall_s": summary.wall_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--seeds", default="0", help="comma-separated, e.g. 0,1,2")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"tiny preset, {args.steps} train steps per run, seeds {seeds}, {usable_cpus()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        rows = [bench(p, args.steps, s, Path(tmp)) for s in seeds for p in PLACEMENTS]
    print(
        f"{'placement':12} {'seed':>4} {'steps/s':>8} {'episodes/s':>11} {'sync ms':>8} "
        f"{'pull ms':>8} "
        f"{'via':>5} {'reward':>13} {'eval':>13} {'wall s':>7}"
    )
    for r in rows:
        print(
            f"{r['placement']:12} {r['seed']:4d} {r['steps_per_s']:8.2f} "
            f"{r['episodes_per_s']:11.1f} {r['weight_sync_ms']:8.1f} {r['pull_ms']:8.1f} "
            f"{r['transport']:>5} "
            f"{r['reward_start']:6.3f}->{r['reward_end']:.3f} "
            f"{r['eval_start']:6.3f}->{r['eval_end']:.3f} {r['wall_s']:7.0f}"
        )
    for seed in seeds:
        one, three = (r for r in rows if r["seed"] == seed)
        print(
            f"seed {seed}: three hosts / one host steps/s "
            f"{three['steps_per_s'] / one['steps_per_s']:.2f}x, weight sync "
            f"{three['weight_sync_ms'] / one['weight_sync_ms']:.2f}x, pull "
            f"{three['pull_ms'] / one['pull_ms']:.2f}x"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
