"""Where prompts come from: offline task generators, a local JSONL file, or a HF dataset
(a file or a dataset in one of the formats of `formats.py`: prompt/target, GSM8K, MATH).

A task yields `Sample(prompt, target)`; the reward function (see `rewards.py`) compares a
response with the target. Nothing here downloads anything unless the user names a Hugging Face
dataset themselves.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path

from async_grpo.config.schema import DataConfig, DataFormat
from async_grpo.seeds import derive_seed
from async_grpo.tasks.formats import FORMAT_KEYS, FormatError, row_to_sample


@dataclasses.dataclass(frozen=True)
class Sample:
    """One prompt and the target its reward is computed against (both plain text)."""

    prompt: str
    target: str


def count_sample(rng: random.Random, min_n: int, max_n: int) -> Sample:
    """ "count to N:" -> "1 2 ... N". The model must read N and stop right after it."""
    n = rng.randint(min_n, max_n)
    return Sample(f"count to {n}:", " ".join(str(i) for i in range(1, n + 1)))


_NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fay")
_ITEMS = ("apples", "books", "coins", "marbles", "pencils", "stamps")


def arithmetic_sample(rng: random.Random, min_n: int, max_n: int) -> Sample:
    """A one-step word problem whose target is the integer answer."""
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    a, b = rng.randint(min_n, max_n), rng.randint(min_n, max_n)
    if rng.random() < 0.5:
        text = f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?"
        answer = a + b
    else:
        a, b = max(a, b), min(a, b)
        text = f"{name} has {a} {item} and gives away {b}. How many {item} are left?"
        answer = a - b
    return Sample(text + " Answer with the number only.", str(answer))


GENERATORS: dict[str, Callable[[random.Random, int, int], Sample]] = {
    "count": count_sample,
    "arithmetic": arithmetic_sample,
}


def eval_set(
    task: str, min_n: int, max_n: int, samples: Sequence[Sample] = (), size: int = 8
) -> list[Sample]:
    """The fixed prompts the policy is evaluated on during a run.

    `count`: every N from `min_n` to `max_n` once, so each one weighs the same. Another
    generated task: `size` draws from a fixed seed. A file or dataset: its first `size`
    samples.
    """
    if samples:
        return list(samples[:size])
    if task == "count":
        return [count_sample(random.Random(0), n, n) for n in range(min_n, max_n + 1)]
    rng = random.Random(12345)
    return [GENERATORS[task](rng, min_n, max_n) for _ in range(size)]


def corpus_for(task: str, min_n: int, max_n: int, samples: Sequence[Sample] = ()) -> list[str]:
    """Text a tiny tokenizer is trained on: every prompt and target the task can produce.

    For the generated tasks, enough draws cover every number and word; for a file or dataset
    the samples themselves are the corpus.
    """
    if samples:
        return [s.prompt for s in samples] + [s.target for s in samples]
    rng = random.Random(0)
    draws = [GENERATORS[task](rng, min_n, max_n) for _ in range(2000)]
    # The count targets for every N are included explicitly, so each number is a token.
    return [d.prompt for d in draws] + [d.target for d in draws]


def load_jsonl(
    path: Path, prompt_key: str = "prompt", target_key: str = "target", fmt: DataFormat = "jsonl"
) -> list[Sample]:
    """Reads one JSON object a line in format `fmt` (`formats.row_to_sample`); a bad line is
    an error naming the file, its number and the key."""
    if not path.is_file():
        raise FileNotFoundError(f"dataset file not found: {path}")
    samples: list[Sample] = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: malformed JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(
                    f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}"
                )
            try:
                samples.append(Sample(*row_to_sample(fmt, row, prompt_key, target_key)))
            except FormatError as e:
                raise ValueError(f"{path}:{lineno}: {e}") from None
    if not samples:
        raise ValueError(f"{path}: no samples in the file")
    return samples


def load_hf_dataset(
    name: str,
    split: str,
    prompt_key: str,
    target_key: str,
    *,
    limit: int = 100_000,
    fmt: DataFormat = "jsonl",
) -> list[Sample]:
    """Loads a Hugging Face dataset by name or local path (needs the optional `datasets`)."""
    try:
        import datasets  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415
    except ImportError:
        raise RuntimeError(
            f"dataset {name!r} needs the Hugging Face `datasets` package: "
            "`uv pip install datasets`, or use a local JSONL file (--data.path FILE.jsonl)"
        ) from None
    ds = datasets.load_dataset(name, split=split)
    columns = set(ds.column_names)
    missing = [k for k in FORMAT_KEYS.get(fmt, (prompt_key, target_key)) if k not in columns]
    if missing:
        raise ValueError(f"dataset {name!r} has no column(s) {missing}; it has {sorted(columns)}")
    samples: list[Sample] = []
    for i, row in enumerate(ds.select(range(min(limit, len(ds))))):
        try:
            samples.append(Sample(*row_to_sample(fmt, row, prompt_key, target_key)))
        except FormatError as e:
            raise ValueError(f"dataset {name!r} row {i}: {e}") from None
    return samples


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
