"""The staleness gate: which weights the trainer and the generators hold, and the one
condition the rollout loops wait on before they generate.

A rollout is admitted when the generators' weights are at most `max_policy_age` versions
behind the trainer's and the prompt ledger hands out a call (not frozen for a checkpoint;
in sync mode, while the current version's batch has room). Generating further ahead would
only produce episodes the buffer must drop as too stale.
"""

from __future__ import annotations

import asyncio

from async_grpo.controller.ledger import Call, Draw, PromptLedger


class StalenessGate:
    """The trainer's version, the oldest version a generator replica runs, and the condition
    rollouts wait on; anything that changes what they wait for (a new version, the prompt
    ledger) calls `set` or `notify`."""

    def __init__(self, max_policy_age: int, trainer: int = 0) -> None:
        self.max_policy_age = max_policy_age
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
        """Closes the gate for good: `admit` returns None from now on."""
        async with self._changed:
            self.stopped = True
            self._changed.notify_all()

    async def wait_generators(self, version: int) -> None:
        """Returns once every generator runs `version` or newer."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.generators >= version)

    async def admit(self, ledger: PromptLedger, draw: Draw | None = None) -> Call | None:
        """The next call of prompts to generate, once the generators are at most
        `max_policy_age` versions behind the trainer and `ledger` hands one out; None once
        the gate is stopped."""

        def ready() -> Call | bool:
            if self.stopped:
                return True
            if self.trainer - self.generators > self.max_policy_age:
                return False
            return ledger.claim(self.generators, draw) or False

        async with self._changed:
            got = await self._changed.wait_for(ready)
        return got if isinstance(got, Call) else None
