"""`evaluate`: a policy's score on a fixed task set (for example an environment's
held-out `eval_tasks`), the number a `Curriculum` reads."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from rl_envs._checks import check_int
from rl_envs.environment import Environment
from rl_envs.episode import EpisodeRecord, Policy, run_episode
from rl_envs.service import EnvironmentService
from rl_envs.types import Task

P = TypeVar("P")


@dataclass(frozen=True)
class EvalResult:
    """Scores over the episodes that completed.

    Attributes:
        mean_reward: mean episode return, in [0, 1] for the built-in environments.
        success_rate: fraction of episodes whose return reached `success_at`.
        episodes: episodes that completed.
        failed: episodes that failed (replica death, environment error, timeout); left out
            of both scores.
    """

    mean_reward: float
    success_rate: float
    episodes: int
    failed: int


async def evaluate(
    policy: Policy[P],
    env: EnvironmentService | Callable[[], Environment],
    tasks: Sequence[Task],
    *,
    success_at: float = 1.0,
    concurrency: int = 8,
    max_turns: int = 32,
) -> tuple[EvalResult, list[EpisodeRecord[P]]]:
    """Plays every task once (up to `concurrency` at a time) and scores the result. `env`
    is a service, or a factory of local environments (one instance per episode)."""
    check_int("concurrency", concurrency, 1)
    if not tasks:
        raise ValueError("evaluate needs at least one task")
    gate = asyncio.Semaphore(concurrency)

    async def one(task: Task) -> EpisodeRecord[P]:
        async with gate:
            target = env if isinstance(env, EnvironmentService) else env()
            return await run_episode(policy, target, task, max_turns=max_turns)

    records = list(await asyncio.gather(*(one(t) for t in tasks)))
    done = [r for r in records if r.ok]
    n = len(done)
    mean = sum(r.reward for r in done) / n if n else 0.0
    success = sum(r.reward >= success_at - 1e-9 for r in done) / n if n else 0.0
    return EvalResult(mean, success, n, len(records) - n), records
