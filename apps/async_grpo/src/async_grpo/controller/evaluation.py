"""Evaluating the policy itself while it trains (on prompts here; on environments'
held-out tasks in `env_eval`).

The training window (the last `window` generated episodes) mixes whichever prompts were drawn
lately: with 16 answers per prompt, a 64-episode window holds 4 prompts, and it swings with
their difficulty as much as with the policy. An evaluation instead scores every prompt of a
fixed set (`tasks.prompts.eval_set`: for `count`, each N once), `group_size` samples each from the
same sampling distribution the rollouts use, and averages per prompt. Its episodes never
reach the replay buffer or the training window. The set, the seeds and the scoring are
`observability/scoring.py`'s, which `async-grpo eval` shares: evaluating a checkpoint with
the run's settings gives the numbers the run recorded for those weights.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from actor_service import Service
from rl_envs import Task

from async_grpo.actors.generator import Generator
from async_grpo.actors.reward import RewardActor
from async_grpo.config.schema import RunConfig
from async_grpo.controller.play import make_encode, play_tasks
from async_grpo.generation.multiturn import Encode, PlayedEpisode, policy_version
from async_grpo.launch.prepare import Prepared
from async_grpo.launch.spawn import Components
from async_grpo.model.policy import load_tokenizer
from async_grpo.observability.metrics import EvalScore, RunMetrics
from async_grpo.observability.scoring import (
    eval_prompts,
    eval_seed,
    reward_inputs,
    score_eval,
)
from async_grpo.seeds import derive_seed
from async_grpo.tasks.environments import TaskSource, mean_by_env
from async_grpo.tasks.prompts import Sample
from async_grpo.weight_sync.update import WeightUpdate

EvalFn = Callable[[int], Awaitable[EvalScore | None]]
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

    async def run(step: int) -> EvalScore | None:
        groups = await generator.endpoint(Generator.generate).route(
            [s.prompt for s in prompts], eval_seed(seed, step), newest()
        )
        texts, targets = reward_inputs(prompts, groups)
        rewards = await reward.endpoint(RewardActor.score).route(texts, targets)
        return score_eval(step, prompts, groups, rewards)

    return run


class Evaluator:
    """Runs evaluations (`run`), at most one at a time, in the background; each finished
    one with a result is appended to `metrics.evals`."""

    def __init__(self, run: EvalFn, metrics: RunMetrics) -> None:
        self._run, self._metrics = run, metrics
        self._task: asyncio.Task[EvalScore | None] | None = None
        self._step = 0

    @property
    def pending(self) -> int | None:
        """The step of the evaluation running now (None if none): a checkpoint records it,
        and the resumed run runs it again."""
        running = self._task is not None and not self._task.done()
        return self._step if running else None

    async def evaluate(self, step: int) -> EvalScore | None:
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

    async def final(self, step: int) -> EvalScore | None:
        """Waits for a running evaluation, then evaluates the generators' current weights."""
        if self._task is not None:
            await self._task
        return await self.evaluate(step)

    def cancel(self) -> None:
        """Drops the running evaluation (the run stops, or is rolled back)."""
        if self._task is not None:
            self._task.cancel()
        self._task = None


def score_env_eval(
    step: int, tasks: Sequence[Task], groups: Sequence[Sequence[PlayedEpisode]]
) -> tuple[EvalScore, dict[str, float]] | None:
    """Folds one evaluation's episodes (a group per task) into a result, and each
    environment's score for its curriculum. A task's score is the mean return of its
    completed episodes; the result's `reward` averages tasks, `exact` is the share of
    completed episodes with a full return, `version` the oldest that sampled a turn. A task
    whose episodes all failed (its environment replica died) is left out rather than scored
    0; when every episode failed there is no result (None)."""
    per_task: list[tuple[Task, float]] = []
    full: list[float] = []
    versions: list[int] = []
    for task, group in zip(tasks, groups, strict=True):
        done = [r for r in group if r.ok]
        if done:
            per_task.append((task, sum(r.reward for r in done) / len(done)))
            full += [float(r.reward >= 1.0 - 1e-9) for r in done]
            versions += [policy_version(r) for r in done]
    if not per_task:
        return None
    result = EvalScore(
        step=step,
        version=min(versions),
        reward=sum(v for _, v in per_task) / len(per_task),
        exact=sum(full) / len(full),
        per_prompt=tuple((f"{t.env} L{t.level} #{t.seed}", v) for t, v in per_task),
    )
    return result, mean_by_env([t for t, _ in per_task], [v for _, v in per_task])


def env_eval(
    c: Components,
    cfg: RunConfig,
    source: TaskSource,
    encode: Encode,
    *,
    log: Callable[[str], None],
    newest: Callable[[], WeightUpdate | None],
) -> EvalFn:
    """Evaluation on each environment's held-out tasks at its current level: the first
    `eval_prompts` of them, `group_size` episodes each, scored by `score_env_eval`. Each
    environment's score then feeds its curriculum (with `--env.curriculum`)."""

    async def run(step: int) -> EvalScore | None:
        tasks = source.eval_tasks(cfg.eval_prompts)
        seed = derive_seed(cfg.seed, "eval", step)
        groups = await play_tasks(c, cfg, encode, tasks, seed=seed, weights=newest())
        scored = score_env_eval(step, tasks, groups)
        if scored is None:
            log(f"[evaluation after step {step}: every episode failed; not recorded]")
            return None
        result, by_env = scored
        for name, change in source.report(by_env):
            to = change.level + 1
            log(f"[{name}: eval {change.score:.2f} at level {change.level}; now level {to}]")
        return result

    return run


def make_evaluator(
    c: Components,
    cfg: RunConfig,
    prep: Prepared,
    metrics: RunMetrics,
    tasks: TaskSource | None,
    *,
    log: Callable[[str], None],
    newest: Callable[[], WeightUpdate | None],
) -> Evaluator:
    """The run's evaluation: on its environments' held-out tasks with `--env.tasks`, else on
    the fixed eval prompts of its data (`tasks.prompts.eval_set`)."""
    if tasks is not None:
        encode = make_encode(load_tokenizer(prep.model_path))
        return Evaluator(env_eval(c, cfg, tasks, encode, log=log, newest=newest), metrics)
    prompts = eval_prompts(cfg.data, prep.samples, cfg.eval_prompts)
    return Evaluator(prompt_eval(c.generator, c.reward, prompts, cfg.seed, newest), metrics)
