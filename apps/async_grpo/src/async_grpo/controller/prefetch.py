"""Prompts asked of the dataset before a rollout needs them.

A rollout's chain (prompts, sampling, rewards, put, the trainer's next batch) has to fit in
one train step for the trainer never to wait at `max_policy_age` 1, and the dataset's round
trip is one of its hops. Prompt `i` is a pure function of `i` (`tasks.prompts.PromptStream`:
the dataset actor keeps no position), so the controller can ask for the next calls' prompts
while the current call samples, and a call drawn again, a rollback or a resume changes
nothing the rollouts see: a prefetched prompt is the one the dataset would answer later.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from async_grpo.tasks.prompts import Sample

Fetch = Callable[[list[int]], Awaitable[list[Sample]]]
"""Asks the dataset for the prompts at these indices, in that order."""


class PromptPrefetch:
    """Answers a call's prompts, and keeps at least the `ahead` prompts after the ledger's
    next index asked for, so that the next calls find theirs here. When fewer are asked, it
    asks for the missing ones in one question, at least `chunk` of them: a question is a
    message, and what it costs the controller and the dataset hardly depends on what it
    carries (the tiny preset's dataset process: 1.7 ms of CPU a step asked every call, 0.3-0.5
    ms asked four calls' worth at a time; `benchmarks/cpu_per_step.py`)."""

    def __init__(self, fetch: Fetch, ahead: int, chunk: int = 0) -> None:
        if ahead < 0:
            raise ValueError(f"ahead must be >= 0, got {ahead}")
        if chunk < 0:
            raise ValueError(f"chunk must be >= 0, got {chunk}")
        self._fetch, self._ahead, self._chunk = fetch, ahead, chunk
        self._asked: dict[int, asyncio.Task[dict[int, Sample]]] = {}  # by prompt index
        self._asked_to = 0  # every index from here on is not asked yet

    async def samples(self, indices: Sequence[int], next_index: int) -> list[Sample]:
        """The prompts at `indices` (a claimed call's), in that order; `next_index` is the
        ledger's next new index: unless the `ahead` from there are asked for already, the
        ones missing are asked for now, at least `chunk` of them."""
        if len(set(indices)) != len(indices):
            raise ValueError(f"a call's prompt indices must differ, got {list(indices)}")
        missing = [i for i in indices if i not in self._asked]
        if missing:
            self._ask(missing)
        start = max(self._asked_to, next_index)
        if start < next_index + self._ahead:
            end = max(next_index + self._ahead, start + self._chunk)
            self._ask(list(range(start, end)))
            self._asked_to = end
        asked = [self._asked.pop(i) for i in indices]
        try:
            answers = [await a for a in dict.fromkeys(asked)]
        except Exception:
            # A prefetch failed (the dataset service was between replicas): ask again, as a
            # call without prefetching would, and let that call's failure be the one seen.
            return await self._fetch(list(indices))
        found = {i: s for answer in answers for i, s in answer.items()}
        return [found[i] for i in indices]

    def _ask(self, indices: list[int]) -> None:
        async def ask() -> dict[int, Sample]:
            return dict(zip(indices, await self._fetch(indices), strict=True))

        task = asyncio.ensure_future(ask())
        # A prefetch nobody awaits (its call never came: the job ended, or a rollback drew
        # lower indices) must not report a lost failure; the job's event loop cancels it.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        for i in indices:
            self._asked[i] = task
