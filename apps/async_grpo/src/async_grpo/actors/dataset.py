"""The dataset actor: hands out prompts with their targets, by index in the run's stream."""

from __future__ import annotations

from monarch.actor import Actor, endpoint

from async_grpo import tracing
from async_grpo.actors.cores import lower_priority, settle_heap
from async_grpo.config.schema import DataConfig
from async_grpo.tasks.prompts import PromptStream, Sample


class DatasetActor(Actor):
    """Prompt `i` of the run (`tasks.prompts.PromptStream`): a generated task's draw, or a sample of
    `samples` (a file or HF dataset) in a shuffled order, reshuffled each epoch. Holds no
    position of its own, so a restarted replica answers exactly as the one it replaces."""

    def __init__(
        self, cfg: DataConfig, samples: list[Sample] | None, seed: int, nice: int = 0
    ) -> None:
        lower_priority(nice)
        tracing.start_from_env("dataset")
        self._stream = PromptStream(cfg, samples, seed)
        settle_heap()

    @endpoint
    async def samples(self, indices: list[int]) -> list[Sample]:
        """The prompts at `indices`, in that order."""
        with tracing.span("sample", count=len(indices)):
            return [self._stream.at(i) for i in indices]
