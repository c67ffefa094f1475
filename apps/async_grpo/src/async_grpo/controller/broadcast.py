"""New weights on their way to every generator replica.

The trainer stages each version (`weight_sync.update`); `sync_weights` has every replica pull one,
and `WeightBroadcast` queues the versions the broadcast loop sends, one fanout at a time,
always the newest. A replica that comes back after a death (or is behind for any reason) also
pulls the newest version itself before it serves: every generation request brings it
(`Generator.generate(..., weights=)`).
"""

from __future__ import annotations

import asyncio

from async_grpo.actors.generator import Generator
from async_grpo.launch.spawn import Components
from async_grpo.weight_sync.update import WeightSync, WeightUpdate, oldest


async def sync_weights(c: Components, update: WeightUpdate, *, exact: bool = False) -> WeightSync:
    """Every generator replica pulls `update` (or newer); returns the oldest version they run
    (with every transport used). The trainer may then reuse the staging of versions older
    than that one: the newest stays staged for a replica that comes back after a death.
    `exact`: every replica runs
    exactly `update` afterwards, even one that ran a newer version (a trainer restored from
    a checkpoint)."""
    syncs: list[WeightSync] = await c.generator.endpoint(Generator.update_weights).fanout(
        update, exact
    )
    synced = oldest(syncs)
    if synced.version > 0:
        await c.trainer.release(synced.version - 1)
    return synced


class WeightBroadcast:
    """The newest weights, on their way to every generator replica.

    `offer` queues a new version; the controller's broadcast loop (`loops.broadcast_loop`)
    takes the newest queued one (`next`) and sends it with one fanout at a time (versions
    published meanwhile are folded into the next fanout). A replica that
    comes back after a death runs its initial weights, so `resend` queues the newest
    version again; a fanout that found no live replica waits for that.
    """

    def __init__(self) -> None:
        self.newest: WeightUpdate | None = None
        self._queue: asyncio.Queue[WeightUpdate] = asyncio.Queue()

    def offer(self, update: WeightUpdate) -> None:
        self.newest = update
        self._queue.put_nowait(update)

    def resend(self) -> None:
        if self.newest is not None:
            self._queue.put_nowait(self.newest)

    def reset(self, update: WeightUpdate) -> None:
        """`update` is the newest from now on, and nothing older is queued (a restored
        trainer's weights replace everything newer)."""
        self._queue = asyncio.Queue()
        self.newest = update

    async def next(self) -> WeightUpdate:
        """Waits for a version to send, and returns the newest queued (older ones queued
        meanwhile are skipped: the newest supersedes them)."""
        update = await self._queue.get()
        while not self._queue.empty():
            update = self._queue.get_nowait()
        return update
