"""Example 06: a service of replicas, a replica killed mid-stream.

What it teaches
    RL code wants "any healthy generator", not "the actor in process 3". A *service*
    (`packages/actor-service`) is a group of replicas of one actor class, each in its own
    process, behind three ways of calling it:

      route     one replica, picked by a router (here round robin);
      fanout    every healthy replica (e.g. "load policy version 7");
      session   every call of one conversation on the same replica, so per-conversation
                state (a KV cache, in a real generator) is still there on the next turn.

    Then the part that matters most at scale: while six callers stream requests through the
    service, one replica's process is killed with SIGKILL. No caller sees an error. Requests
    that were running on the dead replica are sent again to a healthy one, requests that were
    only queued for it move, and the service starts a fresh process in its place. The
    replacement is a *new* process: whatever the old one held (here, the policy version) is
    gone, so the caller pushes it again.

What to look at
    The round-robin distribution, the session's turn counter, the service's log of what it
    saw after the kill (how long until it noticed, how long until the replacement answered),
    the slowest request (one that was running on the killed replica and waited for the
    death to be noticed), and the status table with the restart in it.

Why the environment variable below
    Monarch finds a dead process by polling it, every
    `HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY`. Its default made a death take about 10 s
    to surface on our machine; with 1 s it took 0.4 to 0.9 s. Monarch reads the variable
    when it is first imported (setting it later has no effect) and spawned processes inherit
    it, so it is set before anything imports monarch, `actor_service` included.

Run
    uv run python examples/06_simple_service.py
"""

from __future__ import annotations

import os

os.environ.setdefault("HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY", "1s")

import asyncio
import signal
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import monarch.actor
from actor_service import RoundRobin, Service, ServiceConfig, Sticky, spawn_service
from monarch.actor import Actor, MeshFailure, endpoint

REPLICAS = 3
CALLERS, CALLS_PER_CALLER = 6, 40
CALL_S = 0.05  # how long one "generation" takes
POLICY_VERSION = 7


@dataclass(frozen=True)
class Reply:
    """One answer: which request, which process served it, with which policy version."""

    request: int
    pid: int
    version: int


class Generator(Actor):
    """Stands in for one generator replica: it 'samples' for `seconds`, holds the policy
    version it was given, and counts the turns of each conversation it has seen."""

    def __init__(self) -> None:
        self.version = 0
        self.turns: dict[str, int] = {}

    @endpoint
    async def generate(self, request: int, seconds: float = 0.0) -> Reply:
        await asyncio.sleep(seconds)
        return Reply(request, os.getpid(), self.version)

    @endpoint
    async def load_weights(self, version: int) -> int:
        self.version = version
        return version

    @endpoint
    async def policy_version(self) -> int:
        return self.version

    @endpoint
    async def chat(self, conversation: str) -> tuple[int, int]:
        """(pid, how many turns of `conversation` this replica has seen, this one included)."""
        self.turns[conversation] = self.turns.get(conversation, 0) + 1
        return os.getpid(), self.turns[conversation]


def expect(ok: bool, what: str) -> None:
    """Print a check's outcome; a failed check ends the example with a non-zero status."""
    if not ok:
        raise RuntimeError(f"check failed: {what}")
    print(f"  ok: {what}")


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


async def basics(svc: Service[Generator]) -> list[int]:
    """route, fanout and a session; returns the replicas' pids in index order."""
    pids = [r.pids[0] for r in svc.status().replicas]
    print(f"{REPLICAS} replicas, one process each: pids {pids}\n")

    print("1. route: each call goes to one replica, picked round robin")
    replies = [await svc.generate.route(i) for i in range(12)]
    spread = Counter(r.pid for r in replies)
    print("  12 calls served by: " + ", ".join(f"pid {p}: {n}" for p, n in spread.items()))
    expect(sorted(spread.values()) == [4, 4, 4], "round robin spread 12 calls 4/4/4")

    print("\n2. fanout: one call to every healthy replica")
    versions = await svc.load_weights.fanout(POLICY_VERSION)
    print(f"  load_weights({POLICY_VERSION}) answered {versions}")
    expect(versions == [POLICY_VERSION] * REPLICAS, "every replica holds the new version")

    print("\n3. a session keeps one conversation on one replica")
    async with svc.session() as chat:
        turns = [await chat.chat.route("alice") for _ in range(4)]
    print(f"  in a session:      (pid, turns seen) = {turns}")
    loose = [await svc.chat.route("bob") for _ in range(3)]
    print(f"  without a session: (pid, turns seen) = {loose}")
    expect(
        len({p for p, _ in turns}) == 1 and [n for _, n in turns] == [1, 2, 3, 4],
        "the session's four turns reached one replica, which remembered each one",
    )
    expect(
        [n for _, n in loose] == [1, 1, 1],
        "without a session every turn landed on a replica that had never seen the chat",
    )
    return pids


async def poll_until(ok: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Returns once `ok()` holds; raises after `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ok():
            return
        await asyncio.sleep(0.001)
    raise TimeoutError(f"condition not reached within {timeout_s} s")


async def watch(
    svc: Service[Generator], t0: float, log: list[tuple[float, str]], stop: asyncio.Event
) -> None:
    """Records every change of a replica's state, as the service reports it."""
    seen = {r.index: (r.state, r.pids) for r in svc.status().replicas}
    while not stop.is_set():
        for r in svc.status().replicas:
            if seen[r.index] != (r.state, r.pids):
                was = seen[r.index][0]
                seen[r.index] = (r.state, r.pids)
                pids = f", pids {list(r.pids)}" if r.pids else ""
                change = f"replica {r.index}: {was} -> {r.state} (generation {r.generation}{pids})"
                log.append((time.monotonic() - t0, change))
        await asyncio.sleep(0.005)


async def kill_mid_stream(svc: Service[Generator], pids: list[int]) -> None:
    victim = 1
    total = CALLERS * CALLS_PER_CALLER
    print(f"\n4. {CALLERS} callers stream {total} requests ({CALL_S * 1e3:.0f} ms each); ", end="")
    print(f"replica {victim} (pid {pids[victim]}) is killed with SIGKILL part-way")
    latencies: list[float] = []
    replies: list[Reply] = []
    started = asyncio.Event()
    # `svc.generate` is typed loosely (Any); this form lets mypy check arguments and result.
    generate = svc.endpoint(Generator.generate)

    async def caller(c: int) -> None:
        for k in range(CALLS_PER_CALLER):
            sent = time.monotonic()
            replies.append(await generate.route(c * CALLS_PER_CALLER + k, CALL_S))
            latencies.append(time.monotonic() - sent)
            if len(replies) == total // 4:
                started.set()

    log: list[tuple[float, str]] = []
    stop = asyncio.Event()
    t0 = time.monotonic()
    watcher = asyncio.create_task(watch(svc, t0, log, stop))
    callers = asyncio.gather(*(caller(c) for c in range(CALLERS)))
    await started.wait()
    # Kill it while it is serving, so that a request really is cut off.
    await poll_until(lambda: svc.status().replicas[victim].in_flight > 0)
    os.kill(pids[victim], signal.SIGKILL)
    log.append((time.monotonic() - t0, f"SIGKILL sent to pid {pids[victim]}"))
    await callers
    elapsed = time.monotonic() - t0
    # The replacement may still be starting when the last request returns; wait for it.
    await poll_until(lambda: svc.status().healthy == REPLICAS)
    stop.set()
    await watcher
    status = svc.status()

    print("  what the service saw (seconds since the stream started):")
    for at, what in sorted(log):
        print(f"    {at:6.3f} s  {what}")
    print(f"  {len(replies)} replies in {elapsed:.1f} s; latency median ", end="")
    print(
        f"{statistics.median(latencies) * 1e3:.0f} ms, slowest {max(latencies) * 1e3:.0f} ms ",
        end="",
    )
    print("(a request cut off by the kill waits for the death to be noticed)")
    names = {pids[victim]: " (killed)", status.replicas[victim].pids[0]: " (its replacement)"}
    served = Counter(r.pid for r in replies)
    print("  served by: " + ", ".join(f"pid {p}{names.get(p, '')}: {n}" for p, n in served.items()))
    print("\n  status table after the stream:")
    print("  " + str(status).replace("\n", "\n  "))

    expect(
        sorted(r.request for r in replies) == list(range(total)),
        f"all {total} requests completed, each exactly once, none raised",
    )
    reborn = status.replicas[victim]
    expect(not alive(pids[victim]), f"pid {pids[victim]} is really gone")
    expect(
        reborn.restarts == 1 and reborn.generation == 1 and reborn.pids[0] not in pids,
        f"replica {victim} was restarted once, as a new process (pid {reborn.pids[0]})",
    )
    expect(
        reborn.lost >= 1 and status.retried >= 1 and status.failed == 0,
        f"{reborn.lost} request(s) cut off by the kill were retried elsewhere "
        f"({status.retried} retries, 0 failures)",
    )


async def main() -> None:
    # A failure no owner handles ends up here (by default Monarch exits the script). The
    # service handles its replicas' failures itself; record anything that gets through.
    escaped: list[str] = []

    def record_unhandled(failure: MeshFailure) -> None:
        escaped.append(failure.report())

    monarch.actor.unhandled_fault_hook = record_unhandled

    # Sticky keeps sessions on their replica; everything else goes round robin.
    config = ServiceConfig(
        replicas=REPLICAS, router=Sticky(fallback=RoundRobin()), restart_backoff_s=0.1, name="gen"
    )
    svc = await spawn_service(Generator, config)
    try:
        pids = await basics(svc)
        await kill_mid_stream(svc, pids)

        print("\n5. the replacement is a fresh process: it lost the policy version")
        held = await svc.policy_version.fanout()
        print(f"  policy version per replica: {held}")
        expect(held == [POLICY_VERSION, 0, POLICY_VERSION], "only the replacement starts at 0")
        await svc.load_weights.fanout(POLICY_VERSION)
        held = await svc.policy_version.fanout()
        print(f"  after fanout load_weights({POLICY_VERSION}): {held}")
        expect(held == [POLICY_VERSION] * REPLICAS, "one fanout brings every replica up to date")
    finally:
        await svc.shutdown()
    expect(not escaped, "no failure reached the script: the service handled the kill")


if __name__ == "__main__":
    asyncio.run(main())
