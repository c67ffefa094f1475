"""Example 04: controllers, found by name (service discovery).

What it teaches
    Some actors should exist once per job: a config store, a metrics sink, a weight
    registry. `get_or_spawn_controller(name, Class, *args)` returns the actor registered
    under `name`, creating it (with *its* arguments) if this is the first request. Every
    later caller, from any process, gets the same actor, and its arguments are ignored. So
    no one threads references through constructors: knowing the name is enough.

    The script creates a config store; four workers find it by name, and also find a
    metrics sink that nobody created in advance: the first worker to ask creates it.

What to look at
    Which worker created the metrics sink (it can change from run to run), that every
    caller reached the same one, and that the script's own arguments for it were ignored.

Run
    uv run python examples/04_controllers.py
"""

from __future__ import annotations

import asyncio
import os

from _checks import expect
from monarch.actor import Actor, current_rank, endpoint, get_or_spawn_controller, this_host


class ConfigStore(Actor):
    def __init__(self, lr: float) -> None:
        self.lr = lr

    @endpoint
    async def learning_rate(self) -> float:
        return self.lr


class MetricsSink(Actor):
    """Collects losses from anyone who finds it; remembers who created it, and where."""

    def __init__(self, created_by: str) -> None:
        self.created_by, self.pid = created_by, os.getpid()
        self.losses: list[float] = []

    @endpoint
    async def report(self, loss: float) -> None:
        self.losses.append(loss)

    @endpoint
    async def origin(self) -> tuple[str, int, int]:
        """(who created it, its pid, reports received)."""
        return self.created_by, self.pid, len(self.losses)


class Worker(Actor):
    """Holds no reference to anything; knows only the names."""

    @endpoint
    async def run(self, steps: int) -> float:
        me = f"worker{current_rank().rank}"
        # Arguments after the class are used only by the caller that creates the actor.
        config = await get_or_spawn_controller("config", ConfigStore, float("nan"))
        metrics = await get_or_spawn_controller("metrics", MetricsSink, me)
        lr = await config.learning_rate.call_one()
        loss = 1.0
        for _ in range(steps):
            loss *= 1.0 - lr  # a stand-in for a training step
            await metrics.report.call_one(loss)
        return lr


async def main() -> None:
    config = await get_or_spawn_controller("config", ConfigStore, 0.1)  # the first caller
    procs = this_host().spawn_procs(per_host={"procs": 4})
    try:
        lrs = list((await procs.spawn("workers", Worker).run.call(5)).values())
    finally:
        await procs.stop()
    metrics = await get_or_spawn_controller("metrics", MetricsSink, "the script")
    created_by, pid, reports = await metrics.origin.call_one()
    here = " (this script's process)" if pid == os.getpid() else ""
    print(f"the workers read lr {lrs} from the script's config store")
    print(f"the metrics sink was created by {created_by}, lives in pid {pid}{here}")

    expect(lrs == [await config.learning_rate.call_one()] * 4, "every worker found the config")
    expect(created_by.startswith("worker"), "the first worker to ask created the sink")
    expect(reports == 4 * 5, f"one sink got every worker's reports ({reports})")


if __name__ == "__main__":
    asyncio.run(main())
