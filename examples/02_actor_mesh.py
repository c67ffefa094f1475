"""Example 02: an actor mesh and the five adverbs.

What it teaches
    Spawning one actor class on a mesh of four processes gives an *actor mesh*: four
    actors, one per process, each with its own state, addressed as one object. The adverb
    at the call site says how a message is delivered:

        call        every actor; await a ValueMesh holding one reply per actor
        call_one    exactly one actor (slice the mesh down to one first)
        choose      one actor picked at random
        broadcast   every actor, fire and forget: returns None at once
        stream      every actor; replies arrive in the order they finish

What to look at
    Which rank answered each `choose`, that `broadcast` returned before anyone acted on it,
    the order of the `stream` replies, and the four different final counters.

Run
    uv run python examples/02_actor_mesh.py
"""

from __future__ import annotations

import asyncio

from _checks import expect
from monarch.actor import Actor, current_rank, endpoint, this_host

N = 4


class Counter(Actor):
    def __init__(self) -> None:
        self.rank = current_rank().rank  # this actor's coordinate in the mesh
        self.count = 0

    @endpoint
    async def add(self, amount: int) -> int:
        """Adds to this actor's counter; returns the rank that did it."""
        self.count += amount
        return self.rank

    @endpoint
    async def value(self) -> int:
        return self.count

    @endpoint
    async def slow_rank(self) -> int:
        """Answers after (N - 1 - rank) * 0.3 s: the highest rank first."""
        await asyncio.sleep((N - 1 - self.rank) * 0.3)
        return self.rank


async def demo(counters: Counter) -> None:
    print("call: every actor answers; a ValueMesh comes back")
    ranks = await counters.add.call(0)
    print(f"  {list(ranks.items())}")

    print("call_one: slice the mesh down to one actor, then call it")
    print(f"  rank {await counters.slice(procs=2).add.call_one(10)} added 10")

    chosen = [await counters.add.choose(1) for _ in range(8)]
    print(f"choose: 8 calls, each to one actor at random: ranks {chosen}")

    print("broadcast: add 100 everywhere, no reply to wait for")
    counters.add.broadcast(100)  # returns None: there is nothing to await
    for _ in range(100):  # nothing proves delivery but asking
        values = list((await counters.value.call()).values())
        if min(values) >= 100:
            break
        await asyncio.sleep(0.05)
    print(f"  counters once all had it: {values}")

    print("stream: replies in the order they finish")
    arrivals = [await reply for reply in counters.slow_rank.stream()]
    print(f"  ranks in arrival order: {arrivals}")

    expect(len(ranks) == N, f"call reached all {N} actors")
    expect(min(values) >= 100, "the broadcast reached every actor")
    expect(sum(values) == 10 + 8 + N * 100, "no update was lost")
    expect(len(set(values)) > 1, "state is per actor: the counters differ")
    expect(arrivals == list(range(N - 1, -1, -1)), "stream gave the fastest actor first")


async def main() -> None:
    procs = this_host().spawn_procs(per_host={"procs": N})  # one dimension named "procs"
    try:
        await demo(procs.spawn("counters", Counter))
    finally:
        await procs.stop()


if __name__ == "__main__":
    asyncio.run(main())
