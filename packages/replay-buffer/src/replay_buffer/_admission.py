"""Coroutines parked until the buffer changes (asyncio, single event loop)."""

from __future__ import annotations

import asyncio


class Waiters:
    """Coroutines waiting for a change (room freed, episodes arrived); `wake_all` lets each
    re-check its own condition.

    Waking all (rather than handing the change to one) keeps the logic trivially correct with
    waiters of different sizes: each re-checks the condition itself, and one whose request
    still cannot be met simply waits again. Waiters are few, so the cost is negligible.
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
