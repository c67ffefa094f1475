"""Which weights the trainer and the generators hold, and the one condition the controller's
loops wait on."""

from __future__ import annotations

import asyncio

from async_grpo.ledger import Call, Draw, PromptLedger


class Versions:
    """The trainer's version and the oldest version a generator replica runs, with a
    condition the rollout loops wait on; anything that changes what they wait for (a new
    version, the prompt ledger) calls `set` or `notify`."""

    def __init__(self, trainer: int = 0) -> None:
        self.trainer = trainer
        self.generators = trainer
        self.stopped = False
        self._changed = asyncio.Condition()

    async def set(self, *, trainer: int | None = None, generators: int | None = None) -> None:
        async with self._changed:
            self.trainer = trainer if trainer is not None else self.trainer
            self.generators = generators if generators is not None else self.generators
            self._changed.notify_all()

    async def notify(self) -> None:
        """Waiters check their condition again (the ledger changed)."""
        async with self._changed:
            self._changed.notify_all()

    async def stop(self) -> None:
        """Ends the run for every waiter: `claim` returns None from now on."""
        async with self._changed:
            self.stopped = True
            self._changed.notify_all()

    async def wait_generators(self, version: int) -> None:
        """Returns once every generator runs `version` or newer."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.generators >= version)

    async def claim(
        self, ledger: PromptLedger, max_age: int, draw: Draw | None = None
    ) -> Call | None:
        """The next call of prompts to generate, once the generators are at most `max_age`
        versions behind the trainer and the ledger hands one out (not frozen for a
        checkpoint; in sync mode, while the generators' version's batch has room); None
        once the run is stopped."""

        def ready() -> Call | bool:
            if self.stopped:
                return True
            if self.trainer - self.generators > max_age:
                return False
            return ledger.claim(self.generators, draw) or False

        async with self._changed:
            got = await self._changed.wait_for(ready)
        return got if isinstance(got, Call) else None
