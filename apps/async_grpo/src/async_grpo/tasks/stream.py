"""The run's prompts as a numbered stream: prompt `i` is a pure function of (seed, i).

A rollout asks for prompts by index (`ledger.PromptLedger` hands the indices out), so where
a run stands in its data is one number, a checkpoint saves it exactly, and a prompt lost to
a failure is drawn again, the same prompt, without moving any other. A generated task
draws prompt `i` from a generator seeded by (seed, i); a file or dataset is read in a
shuffled order, reshuffled each epoch (epoch `e`'s order seeded by (seed, e)).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

from async_grpo.config import DataConfig
from async_grpo.tasks import GENERATORS, Sample


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from `parts`, the same in every process and Python version (unlike
    `hash`): distinct parts give independent streams."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def epoch_order(size: int, seed: int, epoch: int) -> list[int]:
    """The order in which epoch `epoch` reads a dataset of `size` samples."""
    order = list(range(size))
    random.Random(derive_seed(seed, "epoch", epoch)).shuffle(order)
    return order


class PromptStream:
    """Prompt `index` of a run: a generated task's draw, or a dataset sample in its epoch's
    order. Keeps the order of the last epoch read, so reading in index order is O(1) per
    prompt (one shuffle per epoch)."""

    def __init__(self, cfg: DataConfig, samples: Sequence[Sample] | None, seed: int) -> None:
        self._cfg, self._samples, self._seed = cfg, list(samples or ()), seed
        self._epoch: tuple[int, list[int]] | None = None

    def at(self, index: int) -> Sample:
        if index < 0:
            raise ValueError(f"prompt index must be >= 0, got {index}")
        if not self._samples:
            rng = random.Random(derive_seed(self._seed, "prompt", index))
            return GENERATORS[self._cfg.task](rng, self._cfg.min_n, self._cfg.max_n)
        epoch, position = divmod(index, len(self._samples))
        if self._epoch is None or self._epoch[0] != epoch:
            self._epoch = (epoch, epoch_order(len(self._samples), self._seed, epoch))
        return self._samples[self._epoch[1][position]]
