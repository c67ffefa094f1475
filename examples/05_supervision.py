"""Example 05: supervision, where a child fails and its owner recovers.

What it teaches
    Whoever spawns a mesh owns it. When an owned actor fails, Monarch calls the owner's
    `__supervise__(failure)`: returning True means "handled"; False passes the failure up.
    At the top is this script, where by default an unhandled failure exits the program.

    A supervisor actor owns three workers, each in its own process, and we make them fail
    in the three ways that matter:

      1. A call raises: the caller gets an `ActorError`; the worker is fine.
      2. A `broadcast` raises: nobody can receive that error, so the worker actor fails
         and its owner is told at once.
      3. The process dies (`os._exit`, as a segfault or an OOM kill would): Monarch notices
         on its next poll of the process and tells the owner.

    In cases 2 and 3 the supervisor replaces the worker with a new process. The script
    never hears of it.

What to look at
    The failure reports, how long each took to be noticed, and the new pids.

Run
    uv run python examples/05_supervision.py
"""

from __future__ import annotations

import os

# Monarch polls spawned processes for death; its default made a death take about 10 s to
# surface here. Spawned processes inherit the variable: set it before Monarch starts.
os.environ.setdefault("HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY", "1s")

import asyncio
import time

import monarch.actor
from _checks import expect
from monarch.actor import Actor, ActorError, MeshFailure, ProcMesh, endpoint, this_host


class Worker(Actor):
    @endpoint
    async def square(self, x: int) -> tuple[int, int]:
        """(pid, x * x); rejects negative x."""
        if x < 0:
            raise ValueError(f"square() needs x >= 0, got {x}")
        return os.getpid(), x * x

    @endpoint
    async def fail(self, how: str) -> None:
        if how == "exit":
            os._exit(1)  # no cleanup: what a segfault or an OOM kill does
        raise RuntimeError("a bug in a message nobody waits for")


class Supervisor(Actor):
    """Owns the workers (it spawned them), so their failures are reported to it."""

    def __init__(self) -> None:
        self.workers: dict[str, tuple[ProcMesh, Worker]] = {}
        self.log: list[str] = []
        self.failed_at = 0.0
        self.replaced = asyncio.Event()

    async def spawn(self, name: str) -> None:
        procs = this_host().spawn_procs(per_host={"procs": 1}, name=name)
        self.workers[name] = procs, procs.spawn(name, Worker)

    @endpoint
    async def start(self) -> None:
        for name in ("w0", "w1", "w2"):
            await self.spawn(name)

    @endpoint
    async def pids(self, x: int) -> dict[str, int]:
        return {n: (await w.square.call_one(x))[0] for n, (_, w) in self.workers.items()}

    @endpoint
    async def bad_call(self) -> str:
        try:
            await self.workers["w0"][1].square.call_one(-1)
        except ActorError as e:
            return str(e.exception)
        return "no error"

    @endpoint
    async def provoke(self, name: str, how: str) -> list[str]:
        self.replaced.clear()
        self.failed_at = time.perf_counter()
        self.workers[name][1].fail.broadcast(how)
        await asyncio.wait_for(self.replaced.wait(), 60)
        return self.log

    # Monarch accepts an async __supervise__ here; its base class only annotates the sync one.
    async def __supervise__(self, failure: MeshFailure) -> bool:  # type: ignore[override]
        name = failure.mesh_name.rpartition("-")[0]  # "<spawn name>-<unique suffix>"
        if name not in self.workers:
            return True  # Monarch's helper actors on a dead process (e.g. "logger-...")
        noticed = time.perf_counter() - self.failed_at
        await self.workers[name][0].stop()  # what is left of the old process
        await self.spawn(name)  # and a new one
        cause = failure.report().strip().splitlines()[-1].strip()
        self.log.append(f"{name}: noticed after {noticed:.2f} s, replaced; cause: {cause}")
        self.replaced.set()
        return True


async def main() -> None:
    escaped: list[str] = []  # failures nobody handled would land here instead of exiting
    monarch.actor.unhandled_fault_hook = lambda failure: escaped.append(failure.report())
    procs = this_host().spawn_procs(per_host={"procs": 1}, name="supervisor")
    try:
        sup = procs.spawn("supervisor", Supervisor)
        await sup.start.call_one()
        before = await sup.pids.call_one(0)
        print(f"workers {before}")
        print(f"1. a call raises; the caller gets: {await sup.bad_call.call_one()}")
        print("2. a broadcast raises: " + (await sup.provoke.call_one("w1", "raise"))[-1])
        print("3. the process exits:  " + (await sup.provoke.call_one("w2", "exit"))[-1])
        after = await sup.pids.call_one(4)
        print(f"workers {after}")

        expect(after["w0"] == before["w0"], "w0 raised to its caller and kept its process")
        expect(all(after[w] != before[w] for w in ("w1", "w2")), "w1 and w2 run in new processes")
        expect(not escaped, "no failure reached the script: the supervisor handled them")
    finally:
        await procs.stop()


if __name__ == "__main__":
    asyncio.run(main())
