"""Example 04: controllers, found by name (service discovery).

What it teaches
    Some actors should exist exactly once per job: a config store, a metrics sink, a weight
    registry. `get_or_spawn_controller(name, Class, *args)` is Monarch's answer. The first
    caller that asks for `name` creates the actor (with *its* arguments); every later caller,
    from any process, gets a reference to that same actor, and their arguments are ignored.
    So no one has to thread references through constructors: any actor that knows the name
    can find the service.

    Here the script creates a config store, then spawns four workers. Each worker looks up
    the config by name, and looks up a metrics sink that nobody created in advance: whichever
    worker asks first creates it. Afterwards the script finds the same metrics sink by name
    and reads what all workers reported.

What to look at
    Which worker created the metrics sink (the first to ask; it can change from run to
    run), that all five callers got the same instance, and that the script's own arguments
    for it ("created by the script") were ignored because it already existed. In Monarch
    0.7.0 controllers are spawned in the script's process (printed pid): they live as long
    as the script does.

Run
    uv run python examples/04_controllers.py
"""

from __future__ import annotations

import asyncio
import os
import uuid
from dataclasses import dataclass

from monarch.actor import Actor, current_rank, endpoint, get_or_spawn_controller, this_host

NUM_WORKERS = 4
STEPS = 5


@dataclass(frozen=True)
class ControllerInfo:
    """Identity of a controller instance: a random id fixed at construction, plus where it
    runs and who constructed it."""

    instance: str
    pid: int
    created_by: str


@dataclass(frozen=True)
class Sighting:
    """What one worker saw: the metrics instance it reached and the learning rate it read."""

    worker: str
    metrics_instance: str
    lr: float


class ConfigStore(Actor):
    """A read-mostly key/value store for run settings."""

    def __init__(self, lr: float) -> None:
        self.lr = lr

    @endpoint
    async def learning_rate(self) -> float:
        return self.lr


class MetricsSink(Actor):
    """Collects (worker, loss) reports from anyone who finds it."""

    def __init__(self, created_by: str) -> None:
        self.info = ControllerInfo(uuid.uuid4().hex[:8], os.getpid(), created_by)
        self.losses: dict[str, list[float]] = {}

    @endpoint
    async def report(self, worker: str, loss: float) -> None:
        self.losses.setdefault(worker, []).append(loss)

    @endpoint
    async def whoami(self) -> ControllerInfo:
        return self.info

    @endpoint
    async def mean_loss(self) -> dict[str, float]:
        return {w: sum(v) / len(v) for w, v in sorted(self.losses.items())}

    @endpoint
    async def report_count(self) -> int:
        return sum(len(v) for v in self.losses.values())


class Worker(Actor):
    """Has no reference to any service; it knows only their names."""

    def __init__(self) -> None:
        self.rank = current_rank().rank
        self.name = f"worker{self.rank}"

    @endpoint
    async def run(self, steps: int) -> Sighting:
        # Args after the class are used only if this call creates the controller. The
        # config store already exists (the script made it), so a worker passes a dummy lr.
        config = await get_or_spawn_controller("config", ConfigStore, float("nan"))
        metrics = await get_or_spawn_controller("metrics", MetricsSink, self.name)
        lr = await config.learning_rate.call_one()
        loss = 1.0 + 0.25 * self.rank  # each worker starts from a different loss
        for _ in range(steps):
            loss *= 1.0 - lr  # a stand-in for one training step
            await metrics.report.call_one(self.name, loss)
        info = await metrics.whoami.call_one()
        return Sighting(worker=self.name, metrics_instance=info.instance, lr=lr)


def expect(ok: bool, what: str) -> None:
    """Print a check's outcome; a failed check ends the example with a non-zero status."""
    if not ok:
        raise RuntimeError(f"check failed: {what}")
    print(f"  ok: {what}")


async def main() -> None:
    # The script is the first caller for "config", so its argument (lr=0.1) is the one used.
    config = await get_or_spawn_controller("config", ConfigStore, 0.1)
    lr = await config.learning_rate.call_one()
    print(f"script (pid {os.getpid()}) created 'config' with lr={lr}\n")

    procs = this_host().spawn_procs(per_host={"procs": NUM_WORKERS})
    try:
        workers = procs.spawn("workers", Worker)
        # All workers start at once and race to be first to ask for "metrics".
        sightings = list((await workers.run.call(STEPS)).values())
    finally:
        await procs.stop()

    for s in sightings:
        print(f"{s.worker}: reached metrics instance {s.metrics_instance}, read lr={s.lr}")

    # The script asks for "metrics" too; its constructor argument is ignored.
    metrics = await get_or_spawn_controller("metrics", MetricsSink, "created by the script")
    info = await metrics.whoami.call_one()
    print(f"\nscript:  reached metrics instance {info.instance}")
    where = " (the script's own process)" if info.pid == os.getpid() else ""
    print(f"metrics: created by {info.created_by}, lives in pid {info.pid}{where}")
    means = await metrics.mean_loss.call_one()
    print("mean loss per worker:", ", ".join(f"{w}={m:.3f}" for w, m in means.items()))
    print()

    expect(
        {s.metrics_instance for s in sightings} == {info.instance},
        f"all {NUM_WORKERS + 1} callers reached the same metrics instance",
    )
    expect(
        info.created_by in {s.worker for s in sightings},
        f"the first worker to ask created it ({info.created_by}); later arguments were ignored",
    )
    expect(all(s.lr == 0.1 for s in sightings), "every worker read the script's config by name")
    count = await metrics.report_count.call_one()
    expect(count == NUM_WORKERS * STEPS, f"the one sink holds every report ({count})")


if __name__ == "__main__":
    asyncio.run(main())
