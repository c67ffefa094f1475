"""How long the course takes, measured from its files, and what its first `uv sync` downloads.

The walk-through is the reading order of README.md: each step is some Markdown to read, some
example code to read, and some commands to run. Its length is estimated from counts, with
three rates that are assumptions, stated here so that anyone can change them:

    prose        words outside code blocks, read at PROSE_WPM words a minute
    code         lines of code (fenced blocks in the Markdown, non-blank lines of the
                 examples), read at CODE_LPM lines a minute
    runs         each command the step asks you to run: RUN_MIN minutes to start it, watch
                 it and read what it prints (an allowance, not a measurement: the wall
                 times measured are in examples/README.md and apps/async_grpo/README.md)

The download size sums the wheels `uv.lock` records for Linux x86-64 and CPython 3.11.
`tests/test_course.py` checks that the total stays near three hours and that README.md
quotes it, and the minutes of the chapters after the course.

Run
    uv run python docs/pacing.py
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.markers import Marker

ROOT = Path(__file__).resolve().parents[1]
PROSE_WPM = 200
CODE_LPM = 15
RUN_MIN = 3.0


@dataclass(frozen=True)
class Step:
    """One step of the reading order: files to read (paths relative to the repository root)
    and how many commands to run."""

    name: str
    read: list[str]
    runs: int = 0
    examples: list[str] = field(default_factory=list)


STEPS = [
    Step("README", ["README.md"]),
    Step("00 overview", ["docs/00_overview.md", "docs/diagrams/async_rl_loop.md"]),
    Step(
        "01 primer + examples 01-05",
        ["docs/01_monarch_primer.md", "examples/README.md"],
        runs=5,
        examples=[
            "examples/01_hello_actor.py",
            "examples/02_actor_mesh.py",
            "examples/03_rdma_transfer.py",
            "examples/04_controllers.py",
            "examples/05_supervision.py",
        ],
    ),
    Step(
        "02 services + example 06",
        ["docs/02_services.md"],
        runs=1,
        examples=["examples/06_simple_service.py"],
    ),
    Step(
        "03 weight sync + example 07",
        [
            "docs/03_weight_sync.md",
            "docs/diagrams/weight_sync_timeline.md",
            "docs/diagrams/control_vs_data_plane.md",
        ],
        runs=2,  # the example, and once more with --mode copy or --transport rdma
        examples=["examples/07_weight_sync.py"],
    ),
    Step(
        "04 resharding + example 08",
        ["docs/04_resharding.md"],
        runs=1,
        examples=["examples/08_dtensor_reshard.py"],
    ),
    Step(
        "05 async RL + example 09, the app, two exercises",
        ["docs/05_async_rl.md", "docs/glossary.md"],
        runs=6,  # example 09, `uv run async-grpo`, the exercises' four commands
        examples=["examples/09_async_rl_train.py"],
    ),
]

# Chapters of capabilities built after the course: read after it, measured the same way,
# not part of its three hours.
FURTHER = [
    Step(
        "06 seeing the system, and the generation engine",
        ["docs/06_seeing_the_system.md", "docs/engines.md"],
        runs=2,  # `uv run async-grpo report RUN_DIR`, `uv run async-grpo sweep`
    ),
    Step(
        "07 environments and tools + example 10",
        ["docs/07_environments.md"],
        runs=3,  # example 10, the sandbox command, `uv run async-grpo --preset repeat`
        examples=["examples/10_multi_turn_env.py"],
    ),
    Step(
        "08 scaling out",
        ["docs/08_scaling_out.md"],
        runs=1,  # the three-local-hosts command
    ),
    Step(
        "09 fault tolerance",
        ["docs/09_fault_tolerance.md"],
        runs=2,  # a run stopped with Ctrl-C, then `--resume`
    ),
]


@dataclass(frozen=True)
class Count:
    """What one step asks of the reader: words of prose, lines of code, commands to run."""

    words: int
    code_lines: int
    runs: int

    @property
    def minutes(self) -> float:
        return self.words / PROSE_WPM + self.code_lines / CODE_LPM + self.runs * RUN_MIN


def count_markdown(text: str) -> tuple[int, int]:
    """(words outside fenced code blocks, non-blank lines inside them)."""
    blocks = re.findall(r"^```.*?^```", text, flags=re.DOTALL | re.MULTILINE)
    code = sum(len([ln for ln in b.splitlines()[1:-1] if ln.strip()]) for b in blocks)
    prose = re.sub(r"^```.*?^```", " ", text, flags=re.DOTALL | re.MULTILINE)
    prose = re.sub(r"\]\([^)]*\)", "]", prose)  # a link's target is not read
    words = len(re.findall(r"[A-Za-z0-9][\w'.,:;/%()=+<>~-]*", prose))
    return words, code


def count_step(step: Step) -> Count:
    words = code = 0
    for path in step.read:
        w, c = count_markdown((ROOT / path).read_text())
        words, code = words + w, code + c
    for path in step.examples:
        code += sum(1 for ln in (ROOT / path).read_text().splitlines() if ln.strip())
    return Count(words, code, step.runs)


def walkthrough() -> list[tuple[Step, Count]]:
    return [(step, count_step(step)) for step in STEPS]


def total_minutes() -> float:
    return sum(c.minutes for _, c in walkthrough())


def further_minutes() -> float:
    """The chapters after the course, together (README.md quotes this too)."""
    return sum(count_step(step).minutes for step in FURTHER)


def download_bytes(platform: str = "x86_64") -> int:
    """Bytes of the wheels a first `uv sync` downloads (the default groups, CPython 3.11)."""
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    versions: dict[str, list[dict[str, Any]]] = {}
    for package in lock["package"]:
        versions.setdefault(package["name"], []).append(package)
    # The root project's dependencies and its default (dev) group, followed transitively,
    # extras included (torch pulls its CUDA libraries in through `cuda-toolkit[...]`).
    todo: list[dict[str, Any]] = [{"name": "monarch-rl"}]
    visited: set[tuple[str, str, tuple[str, ...]]] = set()
    seen: set[tuple[str, str]] = set()
    total = 0
    while todo:
        dep = todo.pop()
        candidates = versions.get(dep["name"], [])
        package = next((p for p in candidates if p["version"] == dep.get("version")), None)
        package = package or (candidates[0] if candidates else None)
        key = (dep["name"], str(dep.get("version")), tuple(dep.get("extra", [])))
        if package is None or key in visited:
            continue
        visited.add(key)
        deps = list(package.get("dependencies", []))
        deps += package.get("dev-dependencies", {}).get("dev", [])
        for extra in dep.get("extra", []):
            deps += package.get("optional-dependencies", {}).get(extra, [])
        todo += [d for d in deps if _applies(d.get("marker", ""), platform)]
        if (package["name"], package["version"]) not in seen:
            seen.add((package["name"], package["version"]))
            total += _wheel_size(package.get("wheels", []), platform)
    return total


def _applies(marker: str, platform: str) -> bool:
    """Whether an environment marker holds on Linux `platform` with CPython 3.11."""
    env = {
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": platform,
        "python_version": "3.11",
        "python_full_version": "3.11.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }
    return not marker or Marker(marker).evaluate(env)


def _wheel_size(wheels: list[dict[str, object]], platform: str) -> int:
    def fits(url: str) -> bool:
        tags = url.rsplit("/", 1)[-1]
        python = "cp311" in tags or "py3-none" in tags or "py2.py3" in tags or "abi3" in tags
        machine = "none-any" in tags or ("manylinux" in tags and platform in tags)
        return python and machine

    sizes = [int(str(w.get("size", 0))) for w in wheels if fits(str(w["url"]))]
    return min(sizes, default=0)


def main() -> None:
    print(f"rates: prose {PROSE_WPM} words/min, code {CODE_LPM} lines/min, ", end="")
    print(f"{RUN_MIN:.0f} min per command run\n")
    print(f"{'step':<52} {'words':>6} {'code':>6} {'runs':>5} {'minutes':>8}")
    rows = walkthrough()
    for step, c in rows:
        print(f"{step.name:<52} {c.words:>6} {c.code_lines:>6} {c.runs:>5} {c.minutes:>8.0f}")
    words = sum(c.words for _, c in rows)
    code = sum(c.code_lines for _, c in rows)
    runs = sum(c.runs for _, c in rows)
    minutes = total_minutes()
    print(f"{'total':<52} {words:>6} {code:>6} {runs:>5} {minutes:>8.0f}")
    for step in FURTHER:
        c = count_step(step)
        print(
            f"further: {step.name:<43} {c.words:>6} {c.code_lines:>6} {c.runs:>5} {c.minutes:>8.0f}"
        )
    print(f"{'further, together':<52} {'':>6} {'':>6} {'':>5} {further_minutes():>8.0f}")
    example_lines = sum(
        sum(1 for ln in (ROOT / p).read_text().splitlines() if ln.strip())
        for s in STEPS
        for p in s.examples
    )
    print(f"\nthe walk-through: about {minutes / 60:.1f} hours ({minutes:.0f} min); ", end="")
    print(f"{example_lines} non-blank lines of examples")
    for platform in ("x86_64", "aarch64"):
        size = download_bytes(platform) / 1e9
        print(f"first `uv sync` on Linux {platform}: {size:.1f} GB of wheels")


if __name__ == "__main__":
    main()
