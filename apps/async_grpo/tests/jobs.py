"""Running whole jobs in tests: a `spawn` that keeps the components a job started (for the
test to kill a replica or read a pid), one that refuses to start anything (bad input must
fail before a process exists), and a run's metrics rows."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from async_grpo.config.schema import RunConfig
from async_grpo.controller.broadcast import WeightBroadcast
from async_grpo.controller.job import Spawn
from async_grpo.controller.ledger import PromptLedger
from async_grpo.launch.spawn import Components, spawn_components
from async_grpo.observability.metrics import RunMetrics

SPAWN_REFUSED = "a process would have been spawned"


def keeping(started: list[Components]) -> Spawn:
    """`spawn_components`, appending every job's `Components` to `started`."""

    async def spawn(*args: object, **kwargs: object) -> Components:
        c = await spawn_components(*args, **kwargs)  # type: ignore[arg-type]
        started.append(c)
        return c

    return spawn


async def refuse_spawn(*args: object, **kwargs: object) -> Components:
    """A `spawn` for tests of bad input: reaching it fails the test."""
    raise AssertionError(SPAWN_REFUSED)


def rows(out_dir: Path) -> list[dict[str, float]]:
    """The metrics.jsonl rows of a run."""
    return [json.loads(x) for x in (out_dir / "metrics.jsonl").read_text().splitlines()]


@dataclasses.dataclass
class Parts:
    """What a rollout uses of a job (`controller.rollout.RolloutParts`), for driving
    `rollout_prompts` by hand on spawned components."""

    cfg: RunConfig
    components: Components
    ledger: PromptLedger
    metrics: RunMetrics
    weights: WeightBroadcast = dataclasses.field(default_factory=WeightBroadcast)


def unaccounted(row: dict[str, float]) -> float:
    """Generated episodes whose fate the row does not account for (`observability/fates.py`):
    0 when every one was trained, went stale, was filtered, dropped or lost, or is held."""
    fates = ("trained", "stale", "filtered", "dropped", "lost", "held")
    return row["episodes_generated"] - sum(row[f"episodes_{f}"] for f in fates)
