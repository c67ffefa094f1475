"""Example 05: supervision, where a child crashes and its parent recovers.

What it teaches
    Monarch arranges actors in an ownership tree: whoever spawns a mesh owns it. When an
    owned actor fails, Monarch calls the owner's `__supervise__(failure)`. Returning True
    means "handled, stop here"; returning False (or having no `__supervise__`) passes the
    failure up to the next owner. At the top is this script, where by default an unhandled
    failure ends the program with exit status 1. So a failure costs nothing until you decide
    where to handle it, and then you handle it in one place.

    Here a supervisor actor owns three worker replicas, each in its own process. We make them
    fail in the three ways that matter:

      1. A call raises. The error goes back to the caller as an `ActorError`; the worker is
         fine and no supervision happens. An exception is only a failure if nobody is
         waiting for the answer.
      2. A fire-and-forget message (`broadcast`) raises. No one can receive that error, so
         the worker actor itself fails and its supervisor is told at once.
      3. The process dies (`os._exit`, as a segfault or an OOM kill would). Monarch notices
         on its next poll of the process and tells the supervisor.

    In cases 2 and 3 the supervisor replaces the replica with a fresh process and carries
    on; the script, which owns the supervisor, never sees a thing.

What to look at
    The failure reports, how long each failure took to be noticed (process death is found by
    polling; this example sets the poll to 1 s instead of Monarch's default, measured at
    about 10 s here), the new pids of the replaced replicas, and the final line: the script
    itself was never told.

Run
    uv run python examples/05_supervision.py
"""

from __future__ import annotations

import os

# How often Monarch polls the state of spawned processes. Its default made a process death
# take about 10 s to surface here; 1 s keeps the demo short. Spawned processes inherit the
# variable, so it must be set before Monarch starts anything.
os.environ.setdefault("HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY", "1s")

import asyncio
import time
from dataclasses import dataclass

import monarch.actor
from monarch.actor import Actor, ActorError, MeshFailure, ProcMesh, endpoint, this_host

REPLICAS = ("replica0", "replica1", "replica2")
RECOVERY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Recovery:
    """One failure the supervisor handled.

    `noticed_after_s`: seconds from provoking the failure to `__supervise__` being called.
    `recovered_after_s`: seconds until the replacement replica answered. `report`: Monarch's
    description of the failure.
    """

    replica: str
    report: str
    old_pid: int
    new_pid: int
    noticed_after_s: float
    recovered_after_s: float


class Worker(Actor):
    @endpoint
    async def square(self, x: int) -> tuple[int, int]:
        """(pid, x*x); rejects negative input to show how a call's error is delivered."""
        if x < 0:
            raise ValueError(f"square() needs x >= 0, got {x}")
        return os.getpid(), x * x

    @endpoint
    async def fail(self) -> None:
        """Raises; sent with `broadcast`, so no caller is there to receive the error."""
        raise RuntimeError("a bug in a message nobody waits for")

    @endpoint
    async def exit_process(self) -> None:
        """Ends the process at once, with no cleanup: what a segfault or an OOM kill does."""
        os._exit(1)


@dataclass
class _Replica:
    procs: ProcMesh
    worker: Worker
    pid: int


class Supervisor(Actor):
    """Owns the replicas (it spawned them), so their failures are reported to it."""

    def __init__(self) -> None:
        self.replicas: dict[str, _Replica] = {}
        self.recoveries: list[Recovery] = []
        self.other_reports: list[str] = []
        # Per replica being failed on purpose: when we did it, and who waits for the outcome.
        self.provoked_at: dict[str, float] = {}
        self.recovered: dict[str, asyncio.Event] = {}

    async def _spawn(self, name: str) -> _Replica:
        procs = this_host().spawn_procs(per_host={"procs": 1}, name=name)
        worker = procs.spawn(name, Worker)
        pid, _ = await worker.square.call_one(0)
        self.replicas[name] = _Replica(procs, worker, pid)
        return self.replicas[name]

    @endpoint
    async def start(self) -> dict[str, int]:
        for name in REPLICAS:
            await self._spawn(name)
        return {name: r.pid for name, r in self.replicas.items()}

    @endpoint
    async def square_everywhere(self, x: int) -> dict[str, tuple[int, int]]:
        return {n: await r.worker.square.call_one(x) for n, r in self.replicas.items()}

    @endpoint
    async def bad_call(self, name: str) -> str:
        try:
            await self.replicas[name].worker.square.call_one(-1)
        except ActorError as e:
            return str(e.exception)
        raise RuntimeError("square(-1) should have raised")

    @endpoint
    async def provoke(self, name: str, how: str) -> None:
        self.provoked_at[name] = time.perf_counter()
        self.recovered[name] = asyncio.Event()
        worker = self.replicas[name].worker
        if how == "raise":
            worker.fail.broadcast()
        elif how == "exit":
            worker.exit_process.broadcast()
        else:
            raise ValueError(f"how must be 'raise' or 'exit', got {how!r}")

    @endpoint
    async def wait_recovered(self, name: str) -> Recovery:
        await asyncio.wait_for(self.recovered[name].wait(), RECOVERY_TIMEOUT_S)
        return next(r for r in reversed(self.recoveries) if r.replica == name)

    @endpoint
    async def unrecognized_reports(self) -> list[str]:
        return list(self.other_reports)

    # Monarch accepts an `async def __supervise__` in an actor with async endpoints (see the
    # docstring of `Actor.__supervise__`); its base class annotates only the sync form.
    async def __supervise__(self, failure: MeshFailure) -> bool:  # type: ignore[override]
        noticed = time.perf_counter()
        # Monarch names a mesh "<name given to spawn>-<unique suffix>".
        name = failure.mesh_name.rpartition("-")[0]
        old = self.replicas.get(name)
        if old is None:
            # Every failure that reaches this method is of something this actor spawned.
            # Besides the replicas, Monarch starts helper actors on each process mesh (a log
            # forwarder named "logger-..."); they die with their process, which is being
            # replaced anyway. Returning False would pass the failure up: this supervisor
            # would fail with it, and by default the script would exit.
            self.other_reports.append(failure.mesh_name)
            return True
        # Replace the replica: stop what is left of the old process, start a new one.
        await old.procs.stop()
        new = await self._spawn(name)
        start = self.provoked_at.get(name, noticed)
        self.recoveries.append(
            Recovery(
                replica=name,
                report=failure.report(),
                old_pid=old.pid,
                new_pid=new.pid,
                noticed_after_s=noticed - start,
                recovered_after_s=time.perf_counter() - start,
            )
        )
        if name in self.recovered:
            self.recovered[name].set()
        return True

    @endpoint
    async def shutdown(self) -> None:
        for r in self.replicas.values():
            await r.procs.stop()


def expect(ok: bool, what: str) -> None:
    """Print a check's outcome; a failed check ends the example with a non-zero status."""
    if not ok:
        raise RuntimeError(f"check failed: {what}")
    print(f"  ok: {what}")


def show(rec: Recovery) -> None:
    # A report is a headline (which actor, under which owner) and the cause; print both.
    lines = [line.strip() for line in rec.report.strip().splitlines() if line.strip()]
    print(f"  __supervise__ was told: {lines[0]}")
    print(f"    cause: {lines[-1]}")
    print(f"  noticed after {rec.noticed_after_s:.2f}s; replaced (pid {rec.old_pid} -> ", end="")
    print(f"{rec.new_pid}) and answering after {rec.recovered_after_s:.2f}s")


async def demo(sup: Supervisor) -> None:
    pids = await sup.start.call_one()
    print(f"three replicas, one process each: {pids}\n")

    print("1. a call raises: the caller gets the error, the worker lives on")
    print(f"  the call raised: {await sup.bad_call.call_one('replica0')}")
    after = await sup.square_everywhere.call_one(3)
    expect(after["replica0"][0] == pids["replica0"], "replica0 still answers, same process")

    print("\n2. a fire-and-forget message raises: the worker actor fails")
    await sup.provoke.call_one("replica1", "raise")
    raised = await sup.wait_recovered.call_one("replica1")
    show(raised)
    expect("a bug in a message nobody waits for" in raised.report, "the report carries the error")

    print("\n3. the process dies (os._exit)")
    await sup.provoke.call_one("replica2", "exit")
    died = await sup.wait_recovered.call_one("replica2")
    show(died)
    others = await sup.unrecognized_reports.call_one()
    print(f"  also reported to the supervisor and accepted: {others}")

    print("\nafter recovery every replica answers")
    final = await sup.square_everywhere.call_one(4)
    for name, (pid, value) in final.items():
        print(f"  {name}: pid {pid}, 4*4={value}")
    expect(all(v == 16 for _, v in final.values()), "all three replicas answer correctly")
    expect(final["replica0"][0] == pids["replica0"], "the healthy replica was left alone")
    expect(
        final["replica1"][0] != pids["replica1"] and final["replica2"][0] != pids["replica2"],
        "the failed replicas run in new processes",
    )
    expect("exited" in died.report, "the report says the process exited")


async def main() -> None:
    # A failure no owner handles ends up here; the default hook exits with status 1. Record
    # it instead, so the check below can say what happened.
    escaped: list[str] = []

    def record_unhandled(failure: MeshFailure) -> None:
        escaped.append(failure.report())

    monarch.actor.unhandled_fault_hook = record_unhandled

    procs = this_host().spawn_procs(per_host={"procs": 1}, name="supervisor")
    try:
        sup = procs.spawn("supervisor", Supervisor)
        try:
            await demo(sup)
        finally:
            await sup.shutdown.call_one()
    finally:
        await procs.stop()
    expect(not escaped, "no failure reached the script: the supervisor handled them all")


if __name__ == "__main__":
    asyncio.run(main())
