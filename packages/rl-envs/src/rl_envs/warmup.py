"""`Warmup`: hold training back until enough experience has been collected."""

from __future__ import annotations

import asyncio

from rl_envs._checks import check_int


class Warmup:
    """Counts collected episodes until `episodes` of them exist, then opens for good.

        warmup = Warmup(episodes=256)
        # rollout loop:  warmup.record(len(group))
        # trainer loop:  await warmup.wait()  (once), then train

    A failed episode is not experience: record only the ones that reached the buffer.
    `Warmup(0)` is open from the start. Pure Python (one asyncio event for `wait`).
    """

    def __init__(self, episodes: int) -> None:
        self.episodes = check_int("Warmup episodes", episodes, 0)
        self.collected = 0
        self._open = asyncio.Event()
        if self.episodes == 0:
            self._open.set()

    def record(self, n: int = 1) -> bool:
        """Counts `n` more collected episodes; returns whether warm-up is over."""
        self.collected += check_int("Warmup.record n", n, 0)
        if self.collected >= self.episodes:
            self._open.set()
        return self.ready

    @property
    def ready(self) -> bool:
        return self._open.is_set()

    @property
    def remaining(self) -> int:
        return max(0, self.episodes - self.collected)

    async def wait(self) -> None:
        """Returns once warm-up is over (at once if it is)."""
        await self._open.wait()

    def __repr__(self) -> str:
        return f"Warmup({self.collected}/{self.episodes}, ready={self.ready})"
