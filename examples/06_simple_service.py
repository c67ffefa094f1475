"""Example 06: a service, built from scratch: healthy replicas, round robin, a retry.

What it teaches
    RL code wants "any healthy generator", not "the actor in process 3". `SimpleService`
    below is that abstraction in about 25 lines: it keeps the set of healthy replicas, sends
    each call to the next healthy one (round robin), and when a replica's process dies under
    a call, it drops the replica from the set and sends the call again elsewhere. Then the
    same is done with `packages/actor-service`, which also starts a new process in place of
    the dead one.

What to look at
    The 3/3/3 spread of nine calls; after the SIGKILL, every call still answered, and the
    healthy set shrinking to two. With the package: the status table, with the restart.

Run
    uv run python examples/06_simple_service.py
"""

from __future__ import annotations

import os

# Monarch notices a dead process by polling it; 1 s instead of its default (about 10 s).
# Must be set before monarch is imported: spawned processes inherit it.
os.environ.setdefault("HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY", "1s")

import asyncio
import signal
from collections import Counter
from collections.abc import Awaitable, Callable

import monarch.actor
from _checks import expect
from actor_service import ReplicaEvent, RoundRobin, ServiceConfig, spawn_service
from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError
from monarch.actor import Actor, ProcMesh, endpoint, this_host

CALL_S = 0.05  # how long one "generation" takes


class Generator(Actor):
    """Stands in for a generator replica: answers after CALL_S seconds, says who it is."""

    @endpoint
    async def generate(self, prompt: int) -> tuple[int, int]:
        await asyncio.sleep(CALL_S)
        return os.getpid(), prompt


class SimpleService:
    """Round robin over the healthy replicas; a call cut off by a replica's death is retried."""

    def __init__(self, replicas: list[Generator]) -> None:
        self.replicas = replicas
        self.healthy = list(range(len(replicas)))  # indices into `replicas`
        self.turn = 0
        self.retried = 0

    def pick(self) -> int:
        if not self.healthy:
            raise RuntimeError("no healthy replica left")
        self.turn = (self.turn + 1) % len(self.healthy)
        return self.healthy[self.turn]

    async def route(self, prompt: int, retries: int = 2) -> tuple[int, int]:
        for _ in range(retries + 1):
            i = self.pick()
            try:
                return await self.replicas[i].generate.call_one(prompt)
            except SupervisionError:  # the replica's process died during the call
                if i in self.healthy:  # another caller may have dropped it already
                    self.healthy.remove(i)
                self.retried += 1
        raise RuntimeError(f"call {prompt} failed on {retries + 1} replicas")


Route = Callable[[int], Awaitable[tuple[int, int]]]


async def stream(route: Route, n: int, kill: int) -> list[tuple[int, int]]:
    """Four callers send `n` calls through `route`; `kill` is SIGKILLed after a quarter."""
    replies: list[tuple[int, int]] = []

    async def caller(c: int) -> None:
        for k in range(c, n, 4):
            replies.append(await route(k))
            if len(replies) == n // 4:
                os.kill(kill, signal.SIGKILL)
                print(f"  SIGKILL sent to pid {kill} after {len(replies)} replies")

    await asyncio.gather(*(caller(c) for c in range(4)))
    return replies


async def from_scratch(procs: list[ProcMesh]) -> None:
    svc = SimpleService([p.spawn("gen", Generator) for p in procs])
    pids = [pid for pid, _ in [await r.generate.call_one(0) for r in svc.replicas]]
    print(f"1. SimpleService over 3 replicas, pids {pids}")
    spread = Counter([(await svc.route(i))[0] for i in range(9)])
    print(f"  9 calls served by: {dict(spread)}")
    expect(sorted(spread.values()) == [3, 3, 3], "round robin spread 9 calls 3/3/3")

    replies = await stream(svc.route, 60, kill=pids[1])
    print(f"  healthy replicas now: {svc.healthy}; calls retried: {svc.retried}")
    expect(sorted(k for _, k in replies) == list(range(60)), "all 60 calls answered, once each")
    expect(svc.healthy == [0, 2] and svc.retried >= 1, "replica 1 dropped, its call retried")


async def with_the_package() -> None:
    config = ServiceConfig(replicas=3, router=RoundRobin(), restart_backoff_s=0.1, name="gen")
    svc = await spawn_service(Generator, config)
    try:
        pids = [r.pids[0] for r in svc.status().replicas]
        print(f"\n2. actor-service over 3 replicas, pids {pids}")
        up = asyncio.Event()

        def on_event(e: ReplicaEvent) -> None:  # the service tells listeners what it did
            why = f"after {e.down_s:.2f} s down" if e.down_s is not None else e.reason
            print(f"  replica {e.replica} {e.kind}: {why}")
            if e.kind == "up":
                up.set()

        svc.add_listener(on_event)
        replies = await stream(svc.generate.route, 60, kill=pids[1])
        await asyncio.wait_for(up.wait(), 60)  # the new process may still be starting
        status = svc.status()
        print("  " + str(status).replace("\n", "\n  "))
        expect(sorted(k for _, k in replies) == list(range(60)), "all 60 calls answered")
        new = status.replicas[1]
        expect(new.restarts == 1 and new.pids[0] not in pids, "replica 1 runs in a new process")
    finally:
        await svc.shutdown()


async def main() -> None:
    # This script owns the replicas it spawns, so their deaths are reported to it, and by
    # default an unhandled one exits the script. SimpleService handles deaths at the call
    # site instead, so note the reports and carry on.
    reports: list[str] = []
    monarch.actor.unhandled_fault_hook = lambda failure: reports.append(failure.mesh_name)
    procs = [this_host().spawn_procs(per_host={"procs": 1}) for _ in range(3)]
    try:
        await from_scratch(procs)
    finally:
        for p in procs:
            await p.stop()
    print(f"  (death reports the script received and ignored: {len(reports)})")
    await with_the_package()


if __name__ == "__main__":
    asyncio.run(main())
