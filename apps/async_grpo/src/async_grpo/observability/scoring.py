"""How an evaluation is seeded and scored: pure functions that the run's periodic evaluation
(`controller/evaluation.py`, through its generator and reward services) and `async-grpo
eval` (`cli/evaluate.py`, sampling in-process) both use, so the two give the same numbers
for the same weights, prompts and seed.

An evaluation samples `n` answers to every prompt of a fixed set (`tasks.prompts.eval_set`)
from the sampling distribution, scores each with the reward functions, and folds them into
one row per prompt (`PromptScore`). A prompt's score is the mean reward of its answers; the
set's is the mean over prompts, so every prompt weighs the same. An answer counts as
*correct* when its reward is at least a threshold (`correct_at`), which is what pass@k
counts (`pass_at_k`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from async_grpo.config.schema import DataConfig
from async_grpo.generation.decoding import Completion
from async_grpo.observability.metrics import EvalScore
from async_grpo.seeds import derive_seed
from async_grpo.tasks.prompts import Sample, eval_set
from async_grpo.tasks.rewards import exact_match


def pass_at_k(n: int, c: int, k: int) -> float:
    """The probability that at least one of `k` answers drawn without replacement from `n`
    sampled answers, `c` of them correct, is correct: 1 - C(n-c, k) / C(n, k), the
    unbiased estimator of pass@k (Chen et al. 2021, "Evaluating Large Language Models
    Trained on Code").

    Computed as 1 - prod_{i=n-c+1..n} (1 - k/i): the binomials themselves overflow a float
    for a few hundred samples, and their ratio loses every digit long before that."""
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0  # every draw of k holds a correct answer
    all_wrong = 1.0
    for i in range(n - c + 1, n + 1):
        all_wrong *= 1.0 - k / i
    return 1.0 - all_wrong


def eval_prompts(data: DataConfig, samples: Sequence[Sample] | None, size: int) -> list[Sample]:
    """The eval set of a run's data (`tasks.prompts.eval_set`): every N of the count task,
    `size` fixed draws of another generated task, or the first `size` samples of a dataset
    (`samples`: the file's or the Hugging Face dataset's, None for a generated task)."""
    return eval_set(data.task, data.min_n, data.max_n, samples or (), size=size)


def eval_seed(seed: int, step: int, batch: int = 0) -> int:
    """The seed of batch `batch` of the evaluation after train step `step` of a run seeded
    `seed`. The run samples its whole eval set as batch 0; `async-grpo eval` splits a large
    set into batches, the first seeded as the run's, so with the run's settings it draws
    the samples the run drew."""
    if batch == 0:
        return derive_seed(seed, "eval", step)
    return derive_seed(seed, "eval", step, "batch", batch)


def reward_inputs(
    prompts: Sequence[Sample], groups: Sequence[Sequence[Completion]]
) -> tuple[list[str], list[str]]:
    """The answers and their targets, flat and prompt-major: what the reward functions
    score (one call to the reward service, or the functions in-process)."""
    texts = [c.text for group in groups for c in group]
    targets = [s.target for s, group in zip(prompts, groups, strict=True) for _ in group]
    return texts, targets


@dataclasses.dataclass(frozen=True)
class PromptScore:
    """One prompt of an evaluation: its `answers` (decoded text, in sampling order), the
    `rewards` of each, and the share of answers equal to the target (`exact`)."""

    prompt: str
    target: str
    answers: tuple[str, ...]
    rewards: tuple[float, ...]
    exact: float

    @property
    def reward(self) -> float:
        """The mean reward of the prompt's answers."""
        return sum(self.rewards) / len(self.rewards)

    def correct(self, correct_at: float) -> int:
        """How many answers have a reward of at least `correct_at`."""
        return sum(r >= correct_at for r in self.rewards)

    def pass_at(self, k: int, correct_at: float) -> float:
        return pass_at_k(len(self.rewards), self.correct(correct_at), k)


def fold(
    prompts: Sequence[Sample], groups: Sequence[Sequence[Completion]], rewards: Sequence[float]
) -> list[PromptScore]:
    """One evaluation's completions (a group per prompt) and their rewards (flat,
    prompt-major, as `reward_inputs` lists them) as one row per prompt."""
    if len(rewards) != sum(len(g) for g in groups):
        raise ValueError(f"{len(rewards)} rewards for {sum(len(g) for g in groups)} answers")
    rows: list[PromptScore] = []
    k = 0
    for sample, group in zip(prompts, groups, strict=True):
        if not group:
            raise ValueError(f"no answers to {sample.prompt!r}")
        scores = tuple(rewards[k : k + len(group)])
        k += len(group)
        exact = sum(exact_match(c.text, sample.target) for c in group) / len(group)
        rows.append(
            PromptScore(sample.prompt, sample.target, tuple(c.text for c in group), scores, exact)
        )
    return rows


def mean_reward(rows: Sequence[PromptScore]) -> float:
    """The mean over prompts of each prompt's mean reward."""
    return sum(r.reward for r in rows) / len(rows)


def mean_exact(rows: Sequence[PromptScore]) -> float:
    """The mean over prompts of each prompt's share of exact answers."""
    return sum(r.exact for r in rows) / len(rows)


def mean_pass_at(rows: Sequence[PromptScore], k: int, correct_at: float) -> float:
    """pass@k of the set: the mean over prompts of each prompt's pass@k."""
    return sum(r.pass_at(k, correct_at) for r in rows) / len(rows)


def score_eval(
    step: int,
    prompts: Sequence[Sample],
    groups: Sequence[Sequence[Completion]],
    rewards: Sequence[float],
) -> EvalScore:
    """Folds one evaluation's completions and rewards (flat, prompt-major) into the run's
    record of it: the mean over prompts of each prompt's mean reward, and the oldest weight
    version that sampled an answer."""
    rows = fold(prompts, groups, rewards)
    return EvalScore(
        step=step,
        version=min(c.policy_version for group in groups for c in group),
        reward=mean_reward(rows),
        exact=mean_exact(rows),
        per_prompt=tuple((r.prompt, r.reward) for r in rows),
    )
