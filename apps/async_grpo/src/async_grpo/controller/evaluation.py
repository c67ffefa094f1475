"""Evaluating the policy itself while it trains (on prompts here; on environments'
held-out tasks in `env_rollout.env_eval`).

The training window (the last `window` generated episodes) mixes whichever prompts were drawn
lately: with 16 answers per prompt, a 64-episode window holds 4 prompts, and it swings with
their difficulty as much as with the policy. An evaluation instead scores every prompt of a
fixed set (`tasks.eval_set`: for `count`, each N once), `group_size` samples each from the
same sampling distribution the rollouts use, and averages per prompt. Its episodes never
reach the replay buffer or the training window.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from actor_service import Service

from async_grpo.actors.generator import Generator
from async_grpo.actors.reward import RewardActor
from async_grpo.metrics import EvalResult, RunMetrics
from async_grpo.prompts import derive_seed
from async_grpo.rewards import exact_match
from async_grpo.sampling import Completion
from async_grpo.tasks import Sample
from async_grpo.weight_sync import WeightUpdate


def score_eval(
    step: int,
    prompts: Sequence[Sample],
    groups: Sequence[Sequence[Completion]],
    rewards: list[float],
) -> EvalResult:
    """Folds one evaluation's completions and rewards (flat, prompt-major) into a result:
    the mean over prompts of each prompt's mean reward."""
    per_prompt: list[tuple[str, float]] = []
    exact: list[float] = []
    k = 0
    for sample, group in zip(prompts, groups, strict=True):
        scores = rewards[k : k + len(group)]
        k += len(group)
        per_prompt.append((sample.prompt, sum(scores) / len(scores)))
        exact.append(sum(exact_match(c.text, sample.target) for c in group) / len(group))
    version = min(c.policy_version for group in groups for c in group)
    return EvalResult(
        step=step,
        version=version,
        reward=sum(r for _, r in per_prompt) / len(per_prompt),
        exact=sum(exact) / len(exact),
        per_prompt=tuple(per_prompt),
    )


EvalFn = Callable[[int], Awaitable[EvalResult | None]]
"""Runs one evaluation, requested after train step `step`; None when it has nothing to
score (every multi-turn episode failed)."""


def prompt_eval(
    generator: Service[Generator],
    reward: Service[RewardActor],
    prompts: list[Sample],
    seed: int,
    newest: Callable[[], WeightUpdate | None],
) -> EvalFn:
    """Evaluation on fixed prompts: `group_size` samples each (seeded by `seed` and the step,
    from the `newest` weights or newer), scored by the reward service."""

    async def run(step: int) -> EvalResult | None:
        groups = await generator.endpoint(Generator.generate).route(
            [s.prompt for s in prompts], derive_seed(seed, "eval", step), newest()
        )
        texts = [c.text for group in groups for c in group]
        targets = [s.target for s, group in zip(prompts, groups, strict=True) for _ in group]
        rewards = await reward.endpoint(RewardActor.score).route(texts, targets)
        return score_eval(step, prompts, groups, rewards)

    return run


class Evaluator:
    """Runs evaluations (`run`), at most one at a time, in the background; each finished
    one with a result is appended to `metrics.evals`."""

    def __init__(self, run: EvalFn, metrics: RunMetrics) -> None:
        self._run, self._metrics = run, metrics
        self._task: asyncio.Task[EvalResult | None] | None = None
        self._step = 0

    @property
    def pending(self) -> int | None:
        """The step of the evaluation running now (None if none): a checkpoint records it,
        and the resumed run runs it again."""
        running = self._task is not None and not self._task.done()
        return self._step if running else None

    async def evaluate(self, step: int) -> EvalResult | None:
        """One evaluation now."""
        result = await self._run(step)
        if result is not None:
            self._metrics.evals.append(result)
        return result

    def request(self, step: int) -> None:
        """Starts an evaluation in the background unless one is running (a failed one
        re-raises here)."""
        if self._task is not None:
            if not self._task.done():
                return
            self._task.result()
        self._step = step
        self._task = asyncio.create_task(self.evaluate(step))

    async def final(self, step: int) -> EvalResult | None:
        """Waits for a running evaluation, then evaluates the generators' current weights."""
        if self._task is not None:
            await self._task
        return await self.evaluate(step)

    def cancel(self) -> None:
        """Drops the running evaluation (the run stops, or is rolled back)."""
        if self._task is not None:
            self._task.cancel()
        self._task = None
