"""Generation requests sent in the order their calls were claimed.

The rollout loops claim calls one after another, but each then waits for its prompts, and
whichever answer is handled first sends its generation request first. With one generator
replica serving requests one at a time (and one reward replica, one buffer), the order of
the requests is the order the calls' episodes reach the buffer, and so decides which prompts
the first train steps see: a run's first two calls, both sampled on the first weights,
could swap, and the same command then ended at a different final evaluation (0.970 or 0.894
on the tiny preset, apps/async_grpo/README.md). A call's samples depend on its prompts,
weights and seed only, so with the requests in claim order the first batches are the same
in every run.

`SendOrder` lets a call's request go once every call claimed before it (by prompt index:
a call drawn again goes before newer ones, as the ledger hands it out) has sent its own or
ended. A call whose earlier calls have not sent within `wait_s` goes ahead: the order makes
runs repeat and must never hold one up (a stuck call fails by its own deadline).
Multi-turn rollouts (`rollout.rollout_env`) are not ordered: each episode makes a request
a turn, interleaved with its environment's answers.
"""

from __future__ import annotations

import asyncio
import contextlib

from async_grpo.controller.ledger import Call

SEND_ORDER_WAIT_S = 5.0
"""The longest a call waits for the calls claimed before it to send their requests."""


class SendOrder:
    """Which claimed calls have not sent their generation request yet, and the wait for
    one's turn. `claimed` must be called in claim order, right after the claim (before the
    rollout awaits anything)."""

    def __init__(self, wait_s: float = SEND_ORDER_WAIT_S) -> None:
        if wait_s <= 0:
            raise ValueError(f"wait_s must be > 0, got {wait_s}")
        self._wait_s = wait_s
        self._unsent: set[int] = set()  # the first prompt index of each call
        self._sent = asyncio.Event()  # set (and replaced) whenever a call leaves `_unsent`

    def claimed(self, call: Call) -> None:
        self._unsent.add(call.indices[0])

    async def turn(self, call: Call) -> None:
        """Returns once no call claimed before `call` is still to send, or after `wait_s`."""
        key = call.indices[0]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._wait_s
        while min(self._unsent, default=key) < key:
            left = deadline - loop.time()
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._sent.wait(), left)

    def done(self, call: Call) -> None:
        """`call` sent its request, or ended without one (it failed or was cancelled)."""
        self._unsent.discard(call.indices[0])
        self._sent.set()
        self._sent = asyncio.Event()
