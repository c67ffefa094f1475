"""Rollouts and evaluations against environment services (`--env.tasks`): the multi-turn
counterparts of `loop.generate_episode` and `evaluation.prompt_eval`."""

from __future__ import annotations

import itertools
from collections.abc import Callable

from rl_envs import Task
from transformers import PreTrainedTokenizerBase

from async_grpo import tracing
from async_grpo.actors.generator import Generator
from async_grpo.components import Components
from async_grpo.config import RunConfig
from async_grpo.environments import TaskSource, mean_by_env
from async_grpo.evaluation import EvalFn
from async_grpo.metrics import EvalResult, RunMetrics
from async_grpo.multiturn import Encode, Record, play, policy_version
from async_grpo.rollout import records_to_episodes


def make_encode(tokenizer: PreTrainedTokenizerBase) -> Encode:
    """The environment's text as token ids, with no special tokens: the policy's own
    end-of-sequence token already separates its turn from what follows."""

    def encode(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    return encode


async def _play(
    c: Components, cfg: RunConfig, encode: Encode, tasks: list[Task]
) -> list[list[Record]]:
    # One generator replica (a sticky session) samples every turn of this play.
    async with c.generator.session() as generator:
        return await play(
            generator.endpoint(Generator.continue_turns).route,
            encode,
            c.envs,
            tasks,
            cfg.sampling.group_size,
            max_turns=cfg.env.max_turns,
            step_timeout_s=cfg.env.step_timeout_s,
        )


async def generate_env_episodes(
    c: Components,
    cfg: RunConfig,
    metrics: RunMetrics,
    group_ids: itertools.count[int],
    *,
    source: TaskSource,
    encode: Encode,
) -> int:
    """One rollout: tasks -> a group of whole episodes per task -> advantages -> the
    replay buffer. Returns the episodes put there."""
    tasks = source.draw(cfg.generator.prompts_per_call)
    with tracing.span("play", track="rollout", episodes=len(tasks) * cfg.sampling.group_size):
        groups = await _play(c, cfg, encode, tasks)
    # Advantages within each group of whole episodes; a group with a failed one is dropped.
    episodes, dropped = records_to_episodes(
        groups, group_ids, encode, scale_by_std=cfg.trainer.scale_by_std
    )
    if episodes:
        with tracing.span("put", track="rollout", episodes=len(episodes)):
            await c.buffer.put.call_one(episodes)
    metrics.record_records(groups, dropped)
    return len(episodes)


def env_eval(
    c: Components,
    cfg: RunConfig,
    source: TaskSource,
    encode: Encode,
    log: Callable[[str], None],
) -> EvalFn:
    """Evaluation on each environment's held-out tasks at its current level: the first
    `eval_prompts` of them, `group_size` episodes each. The score is the mean return per
    task, averaged over tasks; `exact` the share of episodes with a full return. Each
    environment's score then feeds its curriculum (with `--env.curriculum`)."""

    async def run(step: int) -> EvalResult:
        tasks = source.eval_tasks(cfg.eval_prompts)
        groups = await _play(c, cfg, encode, tasks)
        per_task: list[tuple[str, float]] = []
        full: list[float] = []
        versions: list[int] = []
        for task, group in zip(tasks, groups, strict=True):
            done = [r for r in group if r.ok]
            per_task.append(
                (f"{task.env} L{task.level} #{task.seed}", _mean([r.reward for r in done]))
            )
            full += [float(r.reward >= 1.0 - 1e-9) for r in done]
            versions += [policy_version(r) for r in done]
        for name, change in source.report(mean_by_env(tasks, [v for _, v in per_task])):
            to = change.level + 1
            log(f"[{name}: eval {change.score:.2f} at level {change.level}; now level {to}]")
        return EvalResult(
            step=step,
            version=min(versions, default=-1),
            reward=_mean([v for _, v in per_task]),
            exact=_mean(full),
            per_prompt=tuple(per_task),
        )

    return run


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
