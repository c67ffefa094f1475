"""Example 02: an actor mesh and the five adverbs.

What it teaches
    Spawning one actor class on a process mesh of four processes gives an *actor mesh*: four
    independent actors, one per process, each with its own state, addressed as one object.
    How a message is delivered is chosen at the call site by an adverb:

        call        every actor; await a ValueMesh holding one reply per actor
        call_one    exactly one actor (slice the mesh down to one first); await its reply
        choose      one actor picked at random; await its reply
        broadcast   every actor, fire and forget: returns None at once, no reply
        stream      every actor; replies arrive one by one, in the order they finish

What to look at
    Which rank answered each `choose`, that `broadcast` returned before anyone acted on it,
    the order in which `stream` replies arrive, and the final per-actor counters: four
    different values, because state lives in each actor and nowhere else.

Run
    uv run python examples/02_actor_mesh.py
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter as Tally

from monarch.actor import Actor, current_rank, endpoint, this_host

NUM_PROCS = 4
CHOOSE_CALLS = 8
BROADCAST_AMOUNT = 100
# Each rank's `stream` reply is delayed by (NUM_PROCS - 1 - rank) steps, so the highest rank
# finishes first. A step is long enough that scheduling noise on a busy laptop cannot swap
# the order.
STREAM_STEP_S = 0.3


class Counter(Actor):
    """One integer of state per actor."""

    def __init__(self) -> None:
        # The actor's coordinate in the mesh, fixed for its lifetime.
        self.rank = current_rank().rank
        self.count = 0

    @endpoint
    async def whoami(self) -> tuple[int, int]:
        """(rank, pid)."""
        return self.rank, os.getpid()

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
        """Replies with its rank after a rank-dependent delay (highest rank first)."""
        await asyncio.sleep((NUM_PROCS - 1 - self.rank) * STREAM_STEP_S)
        return self.rank


def expect(ok: bool, what: str) -> None:
    """Print a check's outcome; a failed check ends the example with a non-zero status."""
    if not ok:
        raise RuntimeError(f"check failed: {what}")
    print(f"  ok: {what}")


async def until_all_reach(counters: Counter, floor: int) -> tuple[int, list[int]]:
    """Polls every counter until all are >= floor: (queries made, last values seen).

    A broadcast has no reply, so nothing proves delivery; the only way to know is to ask.
    Gives up after five seconds and returns what it saw.
    """
    queries = 0
    while True:
        queries += 1
        values = list((await counters.value.call()).values())
        if all(v >= floor for v in values) or queries == 50:
            return queries, values
        await asyncio.sleep(0.1)


async def demo(counters: Counter) -> None:
    print("call: ask every actor, get a ValueMesh back")
    who = await counters.whoami.call()
    for point, (rank, pid) in who.items():
        print(f"  {point}  rank={rank}  pid={pid}")
    pids = {pid for _, pid in who.values()}
    expect(len(pids) == NUM_PROCS, f"{NUM_PROCS} actors, {NUM_PROCS} different processes")

    print("\ncall_one: slice the mesh down to one actor, then call it")
    rank = await counters.slice(procs=2).add.call_one(10)
    print(f"  rank {rank} added 10")
    try:
        await counters.add.call_one(10)
    except ValueError as e:
        print(f"  call_one on the whole mesh is refused: {e}")
    else:
        raise RuntimeError("call_one on a four-actor mesh should have been refused")

    print(f"\nchoose: {CHOOSE_CALLS} calls, each to one actor picked at random")
    chosen = [await counters.add.choose(1) for _ in range(CHOOSE_CALLS)]
    print(f"  ranks chosen: {chosen}  (per rank: {dict(sorted(Tally(chosen).items()))})")

    print(f"\nbroadcast: add {BROADCAST_AMOUNT} everywhere, without waiting for anyone")
    t0 = time.perf_counter()
    counters.add.broadcast(BROADCAST_AMOUNT)  # returns None: there is nothing to await
    print(f"  broadcast returned after {1e3 * (time.perf_counter() - t0):.2f} ms")
    queries, values = await until_all_reach(counters, BROADCAST_AMOUNT)
    print(f"  every actor had applied it by query #{queries}: counters {values}")
    expect(all(v >= BROADCAST_AMOUNT for v in values), "the broadcast reached every actor")

    print("\nstream: replies arrive as each actor finishes, not in rank order")
    t0 = time.perf_counter()
    arrivals: list[int] = []
    for reply in counters.slow_rank.stream():
        arrivals.append(await reply)
        print(f"  +{time.perf_counter() - t0:.2f}s  rank {arrivals[-1]}")
    expect(sorted(arrivals) == list(range(NUM_PROCS)), "stream delivered one reply per actor")
    expect(arrivals[0] == NUM_PROCS - 1, "the fastest actor's reply came first")

    print("\nstate is per actor: the final counters")
    final = await counters.value.call()
    for point, count in final.items():
        print(f"  {point}  count={count}")
    counts = list(final.values())
    expect(sum(counts) == 10 + CHOOSE_CALLS + NUM_PROCS * BROADCAST_AMOUNT, "no update was lost")
    expect(len(set(counts)) > 1, "the actors hold different values")
    expect(final.item(procs=2) >= 10 + BROADCAST_AMOUNT, "rank 2 kept its call_one update")


async def main() -> None:
    # One process mesh of four processes, laid out along one dimension named "procs".
    procs = this_host().spawn_procs(per_host={"procs": NUM_PROCS})
    try:
        counters = procs.spawn("counters", Counter)
        await demo(counters)
    finally:
        await procs.stop()


if __name__ == "__main__":
    asyncio.run(main())
