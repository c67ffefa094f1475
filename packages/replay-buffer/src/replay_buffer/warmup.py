"""`Warmup`: hold the trainer back until the buffer has been filled with enough experience."""

from __future__ import annotations

import asyncio


class Warmup:
    """Counts episodes that reached the buffer until `episodes` of them exist, then opens for
    good.

        warmup = Warmup(episodes=256)
        # each producer, after a put:  warmup.record(len(group))
        # the trainer, once:           await warmup.wait()

    A failed episode is not experience: record only the ones that reached the buffer.
    `Warmup(0)` is open from the start. Pure Python (one asyncio event for `wait`).
    """

    def __init__(self, episodes: int) -> None:
        self.episodes = _count("Warmup episodes", episodes)
        self.collected = 0
        self._open = asyncio.Event()
        if self.episodes == 0:
            self._open.set()

    def record(self, n: int = 1) -> bool:
        """Counts `n` more episodes in the buffer; returns whether warm-up is over."""
        self.collected += _count("Warmup.record n", n)
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


def _count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return value
