"""The staleness gate: which weights the trainer and the generators hold, and the one
condition the rollout loops wait on before they generate.

A call of prompts brings the trainer's newest weights along (a replica that runs older ones
pulls them first), so it is sampled from the trainer's newest version t or newer, without
waiting for the broadcast to reach every replica. Its episodes can be trained by the steps
that start at versions t to t + `max_policy_age`, one batch each, counting each step sent
to the trainer (computing, or queued behind the one computing) as its new version. So a
rollout is admitted when:

- the admission window has room: at most that many batches of groups are outstanding (in
  flight in a rollout, or held in the buffer); more would wait in the buffer until they were
  too stale and were dropped. While the buffer is warming up (`buffer.warmup_episodes`),
  the window is at least the warm-up fill. In sync mode (`max_policy_age` 0) the window is
  shut while a step runs (nothing is generated on the weights it is replacing), and the
  prompt ledger hands out exactly one batch per version;
- the prompt ledger hands out a call (not frozen for a checkpoint; in sync mode, while the
  version's batch has room), of at most the window's room.
"""

from __future__ import annotations

import asyncio

from async_grpo.controller.ledger import Call, Draw, PromptLedger


class StalenessGate:
    """The trainer's version, the oldest version a generator replica runs, and the condition
    rollouts wait on; anything that changes what they wait for (a new version, the prompt
    ledger) calls `set` or `notify`."""

    def __init__(self, max_policy_age: int, batch_groups: int, trainer: int = 0) -> None:
        self.max_policy_age = max_policy_age
        self.batch_groups = batch_groups
        self.trainer = trainer
        self.generators = trainer
        self.steps_sent = 0
        """Train steps sent and not answered: the newest will make version
        `trainer + steps_sent`."""
        self.warmup_groups = 0
        """Groups the buffer still needs for its warm-up fill (the window is at least that)."""
        self.stopped = False
        self._changed = asyncio.Condition()

    async def set(self, *, trainer: int | None = None, generators: int | None = None) -> None:
        """New versions; a trainer version set here has no step in flight (a restore)."""
        async with self._changed:
            if trainer is not None:
                self.trainer, self.steps_sent = trainer, 0
            self.generators = generators if generators is not None else self.generators
            self._changed.notify_all()

    def step_started(self) -> None:
        """A train step was sent: from now on admission counts its version as the
        trainer's. (It only tightens the condition, so no waiter needs waking.)"""
        self.steps_sent += 1

    async def step_ended(self, version: int) -> None:
        """The oldest step sent answered: the trainer holds `version`."""
        async with self._changed:
            self.trainer, self.steps_sent = version, max(0, self.steps_sent - 1)
            self._changed.notify_all()

    def room(self, outstanding: int) -> int:
        """Groups a new call may take, given `outstanding` groups (in flight or held)."""
        steps = self.max_policy_age + 1 - self.steps_sent
        return max(steps * self.batch_groups, self.warmup_groups) - outstanding

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
        """The next call of prompts to generate, once what it generates can still be trained
        (see the module docstring) and `ledger` hands one out; None once the gate is
        stopped."""

        def ready() -> Call | bool:
            if self.stopped:
                return True
            if self.steps_sent and self.max_policy_age == 0:
                return False
            # Sync mode's ledger hands out one batch per version: that is its window.
            limit = None if ledger.sync else self.room(ledger.outstanding())
            return ledger.claim(self.trainer, draw, limit) or False

        async with self._changed:
            got = await self._changed.wait_for(ready)
        return got if isinstance(got, Call) else None
