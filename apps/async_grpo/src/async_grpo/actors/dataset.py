"""The dataset actor: hands out prompts with their targets."""

from __future__ import annotations

import random

from monarch.actor import Actor, endpoint

from async_grpo import tracing
from async_grpo.config import DataConfig
from async_grpo.tasks import GENERATORS, Sample


class DatasetActor(Actor):
    """Draws from a generated task, or cycles through `samples` (a file or HF dataset) in a
    shuffled order, reshuffled each epoch."""

    def __init__(self, cfg: DataConfig, samples: list[Sample] | None, seed: int) -> None:
        tracing.start_from_env("dataset")
        self._cfg = cfg
        self._samples = list(samples) if samples else []
        self._rng = random.Random(seed)
        self._order: list[int] = []

    @endpoint
    async def sample(self, count: int) -> list[Sample]:
        with tracing.span("sample", count=count):
            return self._sample(count)

    def _sample(self, count: int) -> list[Sample]:
        if not self._samples:
            gen = GENERATORS[self._cfg.task]
            return [gen(self._rng, self._cfg.min_n, self._cfg.max_n) for _ in range(count)]
        out: list[Sample] = []
        while len(out) < count:
            if not self._order:
                self._order = list(range(len(self._samples)))
                self._rng.shuffle(self._order)
            out.append(self._samples[self._order.pop()])
        return out
