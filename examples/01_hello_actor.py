"""Example 01: hello, actor.

What it teaches
    An actor is a Python object that lives in some process and is reached only through
    messages. You define one by subclassing `Actor` and marking the methods others may call
    with `@endpoint`; you create one by spawning it on a process mesh; you talk to it with an
    adverb such as `call_one`, which returns a future you `await`.

    The same class is spawned twice: once in a fresh process started for it
    (`this_host().spawn_procs`), once inside this script's own process (`this_proc()`). The
    calling code is identical; only the printed pid tells them apart. That is the point of
    Monarch: code that reads as local, whatever process it runs in.

What to look at
    The two pids the actors report (one differs from the script's pid, one is equal to it),
    the host name, whether a GPU is visible, that each actor kept its own state, and what a
    process costs to start compared with what a message costs once it runs.

Run
    uv run python examples/01_hello_actor.py
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import time
from dataclasses import dataclass

import torch
from monarch.actor import Actor, endpoint, this_host, this_proc

ROUND_TRIPS = 20


@dataclass(frozen=True)
class Whereabouts:
    """Where an actor runs, as the actor itself sees it.

    `gpu` is the name of CUDA device 0, or None when the process sees no GPU.
    """

    greeting: str
    pid: int
    host: str
    gpu: str | None


class Greeter(Actor):
    """Holds one piece of state (its greeting) and answers one endpoint."""

    def __init__(self, greeting: str) -> None:
        self.greeting = greeting
        self.calls = 0

    @endpoint
    async def hello(self, name: str) -> Whereabouts:
        self.calls += 1
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        return Whereabouts(
            greeting=f"{self.greeting}, {name} (call #{self.calls})",
            pid=os.getpid(),
            host=socket.gethostname(),
            gpu=gpu,
        )


def expect(ok: bool, what: str) -> None:
    """Print a check's outcome; a failed check ends the example with a non-zero status."""
    if not ok:
        raise RuntimeError(f"check failed: {what}")
    print(f"  ok: {what}")


def show(label: str, w: Whereabouts) -> None:
    gpu = w.gpu or "no GPU visible (CPU only)"
    print(f"{label:<26} {w.greeting!r:<32} pid={w.pid:<7} host={w.host}  {gpu}")


async def main() -> None:
    print(f"this script runs as pid {os.getpid()} on {socket.gethostname()}\n")

    # A process mesh of one fresh process on this machine. Spawning returns at once; the
    # process and the actor start in the background, and the first call waits for them.
    t0 = time.perf_counter()
    procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        remote = procs.spawn("greeter", Greeter, "hello")
        # The same class, spawned inside this very process.
        local = this_proc().spawn("local_greeter", Greeter, "hi")

        first = await remote.hello.call_one("learner")
        t_first = time.perf_counter() - t0
        again = await remote.hello.call_one("learner")
        mine = await local.hello.call_one("learner")
        show("actor in its own process:", first)
        show("same actor, second call:", again)
        show("actor in this process:", mine)

        # What a message costs once everything is up: a round trip to the other process.
        trips = []
        for _ in range(ROUND_TRIPS):
            t = time.perf_counter()
            await remote.hello.call_one("timer")
            trips.append(time.perf_counter() - t)
        print(f"\nfirst reply {t_first:.2f}s after spawning (a new Python process, imports, the")
        print(
            f"actor's __init__); after that, median round trip over {ROUND_TRIPS} calls: ", end=""
        )
        print(f"{1e3 * statistics.median(trips):.2f} ms\n")

        expect(first.pid != os.getpid(), "the spawned actor runs in another process")
        expect(mine.pid == os.getpid(), "the this_proc() actor runs in this script's process")
        expect(again.greeting.endswith("#2)"), "an actor keeps its state between calls")
        expect(
            (await remote.hello.call_one("x")).greeting.endswith(f"#{ROUND_TRIPS + 3})"),
            "every call reached the same actor",
        )
        expect(mine.greeting.endswith("#1)"), "each actor has its own state")
    finally:
        # Stop what we spawned, also when a check failed: no orphan processes.
        await procs.stop()


if __name__ == "__main__":
    asyncio.run(main())
