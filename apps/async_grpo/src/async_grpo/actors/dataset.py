"""The dataset actor: hands out prompts with their targets, by index in the run's stream."""

from __future__ import annotations

from monarch.actor import Actor, endpoint

from async_grpo import tracing
from async_grpo.actors.cores import ProcessSetup, settle_heap, share_cores
from async_grpo.config.schema import DataConfig
from async_grpo.tasks.prompts import PromptStream, Sample


class DatasetActor(Actor):
    """Prompt `i` of the run (`tasks.prompts.PromptStream`): a generated task's draw, or a sample of
    `samples` (a file or HF dataset) in a shuffled order, reshuffled each epoch. Holds no
    position of its own, so a restarted replica answers exactly as the one it replaces."""

    def __init__(
        self,
        cfg: DataConfig,
        samples: list[Sample] | None,
        seed: int,
        setup: ProcessSetup | None = None,
    ) -> None:
        share_cores(setup, "dataset")
        tracing.start_from_env("dataset")
        self._stream = PromptStream(cfg, samples, seed)
        settle_heap()

    @endpoint
    async def samples(self, indices: list[int]) -> list[Sample]:
        """The prompts at `indices`, in that order."""
        with tracing.span("sample", count=len(indices)):
            return [self._stream.at(i) for i in indices]
