"""Producers parked until the buffer has room (asyncio, single event loop)."""

from __future__ import annotations

import asyncio


class RoomWaiters:
    """Coroutines waiting for the buffer to drain; `wake_all` lets each re-check for room.

    Waking all (rather than handing room to one) keeps the logic trivially correct with
    waiters of different sizes: each re-checks the condition itself, and one whose request
    still does not fit simply waits again. Producers are few, so the cost is negligible.
    """

    def __init__(self) -> None:
        self._futures: set[asyncio.Future[None]] = set()

    def __len__(self) -> int:
        return len(self._futures)

    async def wait(self) -> None:
        """Returns after the next `wake_all` (or raises if the waiting task is cancelled)."""
        future = asyncio.get_running_loop().create_future()
        self._futures.add(future)
        try:
            await future
        finally:
            self._futures.discard(future)

    def wake_all(self) -> None:
        for future in self._futures:
            if not future.done():
                future.set_result(None)
