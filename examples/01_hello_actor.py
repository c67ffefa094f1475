"""Example 01: hello, actor.

What it teaches
    An actor is a Python object that lives in some process and is reached only through
    messages. Define one by subclassing `Actor` and marking the methods others may call with
    `@endpoint`; create one by spawning it on a process mesh; talk to it with an adverb such
    as `call_one`, which returns a future you `await`. The same class is spawned in a new
    process and in this script's own process: the calling code is identical, only the pid
    differs.

What to look at
    The pids (one differs from the script's, one equals it), whether a GPU is visible, and
    what starting a process costs against what a message costs once it runs.

Run
    uv run python examples/01_hello_actor.py
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time

import torch
from _checks import expect
from monarch.actor import Actor, endpoint, this_host, this_proc


class Greeter(Actor):
    """One piece of state (a call counter) and one endpoint."""

    def __init__(self, greeting: str) -> None:
        self.greeting = greeting
        self.calls = 0

    @endpoint
    async def hello(self, name: str) -> tuple[str, int, str]:
        """(greeting, pid of the process the actor runs in, the GPU it sees)."""
        self.calls += 1
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
        return f"{self.greeting}, {name} (call #{self.calls})", os.getpid(), gpu


async def main() -> None:
    print(f"this script is pid {os.getpid()}")
    t0 = time.perf_counter()
    procs = this_host().spawn_procs(per_host={"procs": 1})  # returns at once
    try:
        remote = procs.spawn("greeter", Greeter, "hello")  # in the new process
        local = this_proc().spawn("local_greeter", Greeter, "hi")  # in this process
        first = await remote.hello.call_one("learner")  # waits for the process to start
        started = time.perf_counter() - t0
        mine = await local.hello.call_one("learner")
        print(f"  remote actor: {first}")
        print(f"  local actor:  {mine}")

        trips = []
        for _ in range(20):
            t = time.perf_counter()
            last = await remote.hello.call_one("again")
            trips.append(time.perf_counter() - t)
        print(f"first reply {started:.2f} s after spawning (a new Python process, imports,")
        print(f"__init__); then a round trip took {1e3 * statistics.median(trips):.2f} ms (median)")

        expect(first[1] != os.getpid(), "the spawned actor runs in another process")
        expect(mine[1] == os.getpid(), "the this_proc() actor runs in this script's process")
        expect(last[0].endswith("#21)"), "every call reached the same actor, which kept count")
        expect(mine[0].endswith("#1)"), "each actor has its own state")
    finally:
        await procs.stop()  # also when a check failed: no orphan processes


if __name__ == "__main__":
    asyncio.run(main())
