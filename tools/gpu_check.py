"""The Python half of `tools/gpu_check.sh`: checks the environment, samples memory while the
app runs, and turns every part's files into one JSON file and a short table (that last step
lives in `gpu_check_report.py`).

    python3 tools/gpu_check.py environment --json ENV.json     # imports, versions, one actor
    python3 tools/gpu_check.py sample-memory --out MEM.jsonl --processes DIR/processes.json
    python3 tools/gpu_check.py summarize WORK OUT              # OUT/gpu_check.json + the table

Only `environment` imports torch and Monarch; the rest is the standard library (plus psutil,
when installed, for resident memory), so a broken install still gets its report. The app is
read only through its output files (`metrics.jsonl` rows, `processes.json`, `trace.json`),
never imported here: what they hold is documented in async_grpo's `observability.metrics.StepRow`,
`controller.job.PROCESSES_FILE` and `tracing.files.merge`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpu_check_report import summarize  # the script's folder is on sys.path

MODULES = (
    "monarch.actor",
    "rdma_tensor",
    "actor_service",
    "replay_buffer",
    "dtensor_reshard",
    "rl_envs",
    "async_grpo.cli",
)
DISTRIBUTIONS = (
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "numpy",
    "torchmonarch",
    "tyro",
    "pytest",
    "pytest-asyncio",
    "pytest-timeout",
)


# ---------------------------------------------------------------- environment


def environment(out: Path, site: str) -> int:
    """Imports what every part imports, records versions and the GPU, checks that the
    carried wheels' requirements are met, and spawns one Monarch actor."""
    import importlib  # noqa: PLC0415  (this subcommand alone needs the heavy imports)
    from importlib import metadata  # noqa: PLC0415

    info: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable}
    problems: list[str] = []
    for module in MODULES:
        try:
            importlib.import_module(module)
        except Exception as e:
            problems.append(f"import {module}: {type(e).__name__}: {e}")
    versions: dict[str, str | None] = {}
    for dist in DISTRIBUTIONS:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    info["versions"] = versions
    import torch  # noqa: PLC0415

    info["cuda"] = torch.cuda.is_available()
    if info["cuda"]:
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = {
            "name": props.name,
            "memory_gib": round(props.total_memory / 2**30, 1),
            "capability": f"{props.major}.{props.minor}",
            "count": torch.cuda.device_count(),
            "torch_cuda": torch.version.cuda,
        }
    info["unmet_requirements"] = _unmet_requirements(site) if site else []
    try:
        info["actor"] = asyncio.run(_spawn_one_actor())
    except Exception as e:
        problems.append(f"spawning a Monarch actor: {type(e).__name__}: {e}")
    info["problems"] = problems
    out.write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info, indent=2))
    for p in problems:
        print(f"PROBLEM: {p}")
    return 1 if problems else 0


def _unmet_requirements(site: str) -> list[str]:
    """Requirements of the wheels installed into `site` (not torchmonarch's: it lists
    packages it never imports on these code paths) that no installed version meets."""
    from importlib import metadata  # noqa: PLC0415

    from packaging.requirements import Requirement  # noqa: PLC0415

    unmet = []
    for dist in metadata.distributions(path=[site]):
        name = dist.metadata["Name"]
        if name == "torchmonarch":
            continue
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            try:
                have = metadata.version(req.name)
            except metadata.PackageNotFoundError:
                unmet.append(f"{name} needs {req}: not installed")
                continue
            if req.specifier and not req.specifier.contains(have, prereleases=True):
                unmet.append(f"{name} needs {req}: {have} installed")
    return unmet


async def _spawn_one_actor() -> dict[str, Any]:
    from monarch.actor import Actor, endpoint, this_host  # noqa: PLC0415

    class Probe(Actor):
        @endpoint
        async def where(self) -> dict[str, Any]:
            import torch  # noqa: PLC0415

            return {"pid": os.getpid(), "cuda_in_actor": torch.cuda.is_available()}

    start = time.perf_counter()
    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        answer = await procs.spawn("probe", Probe).where.call_one()
    finally:
        await procs.stop()
    return {**answer, "seconds": round(time.perf_counter() - start, 2)}


# ---------------------------------------------------------------- memory sampling


def sample_memory(out: Path, processes: Path, interval: float) -> int:
    """Appends one JSON line per `interval` seconds until SIGTERM: GPU memory per pid
    (nvidia-smi) and the resident memory of the run's processes (psutil, when installed)."""
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    smi = shutil.which("nvidia-smi")
    try:
        import psutil  # type: ignore[import-untyped]  # noqa: PLC0415
    except ImportError:
        psutil = None
    with out.open("a", encoding="utf-8") as f:
        while not stop:
            row: dict[str, Any] = {"t": time.time()}
            if smi:
                row |= _nvidia_smi(smi)
            pids = _pids(processes)
            if psutil is not None and pids:
                rss = {}
                for pid in pids:
                    with contextlib.suppress(Exception):
                        rss[str(pid)] = psutil.Process(pid).memory_info().rss / 2**20
                row["rss_mib"] = rss
            f.write(json.dumps(row) + "\n")
            f.flush()
            time.sleep(interval)
    return 0


def _nvidia_smi(smi: str) -> dict[str, Any]:
    def query(*args: str) -> list[list[str]]:
        text = subprocess.run(
            [smi, *args, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
        return [[c.strip() for c in line.split(",")] for line in text.splitlines() if line]

    row: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        apps = query("--query-compute-apps=pid,used_memory")
        row["gpu_mib"] = {pid: _number(mib) for pid, mib in apps}
    with contextlib.suppress(Exception):
        used, util = query("--query-gpu=memory.used,utilization.gpu")[0]
        row["gpu_used_mib"], row["gpu_util"] = _number(used), _number(util)
    return row


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]"


def _pids(processes: Path) -> list[int]:
    """The pids in the app's processes.json, and its controller's (`controller.pid`)."""
    pids: list[int] = []
    with contextlib.suppress(Exception):
        pids += [p for group in json.loads(processes.read_text()).values() for p in group]
    with contextlib.suppress(Exception):
        pids.append(int((processes.parent / "controller.pid").read_text()))
    return pids


# ---------------------------------------------------------------- summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    e = sub.add_parser("environment")
    e.add_argument("--json", type=Path, required=True)
    e.add_argument("--site", default="", help="the folder the carried wheels went into")
    s = sub.add_parser("sample-memory")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--processes", type=Path, required=True)
    s.add_argument("--interval", type=float, default=0.5)
    z = sub.add_parser("summarize")
    z.add_argument("work", type=Path)
    z.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    if args.command == "environment":
        return environment(args.json, args.site)
    if args.command == "sample-memory":
        return sample_memory(args.out, args.processes, args.interval)
    return summarize(args.work, args.out)


if __name__ == "__main__":
    sys.exit(main())
