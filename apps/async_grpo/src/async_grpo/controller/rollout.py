"""Rollouts and evaluations against environment services (`--env.tasks`): the multi-turn
counterparts of `loop.generate_episode` and `evaluation.prompt_eval`."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

from rl_envs import Task
from transformers import PreTrainedTokenizerBase

from async_grpo import tracing
from async_grpo.actors.generator import Generator
from async_grpo.components import Components
from async_grpo.config import RunConfig
from async_grpo.environments import TaskSource, mean_by_env
from async_grpo.evaluation import EvalFn
from async_grpo.ledger import Call, PromptLedger
from async_grpo.loop import put_episodes
from async_grpo.metrics import EvalResult, RunMetrics
from async_grpo.multiturn import Encode, Record, play, policy_version
from async_grpo.prompts import derive_seed
from async_grpo.rollout import records_to_episodes
from async_grpo.sampling import Completion
from async_grpo.weight_sync import WeightUpdate


def make_encode(tokenizer: PreTrainedTokenizerBase) -> Encode:
    """The environment's text as token ids, with no special tokens: the policy's own
    end-of-sequence token already separates its turn from what follows."""

    def encode(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    return encode


async def _play(
    c: Components,
    cfg: RunConfig,
    encode: Encode,
    tasks: Sequence[Task],
    *,
    seed: int,
    weights: WeightUpdate | None,
) -> list[list[Record]]:
    # One generator replica (a sticky session) samples every turn of this play; each round
    # of turns has its own seed, derived from the play's.
    rounds = itertools.count()
    async with c.generator.session() as generator:
        route = generator.endpoint(Generator.continue_turns).route

        async def turns(contexts: list[list[int]]) -> list[Completion]:
            return await route(contexts, derive_seed(seed, next(rounds)), weights)

        return await play(
            turns,
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
    ledger: PromptLedger,
    call: Call,
    *,
    encode: Encode,
    weights: WeightUpdate | None,
) -> int:
    """One rollout: the call's tasks -> a group of whole episodes per task -> advantages ->
    the replay buffer. Returns the episodes put there."""
    tasks = call.tasks or ()
    with tracing.span("play", track="rollout", episodes=len(tasks) * cfg.sampling.group_size):
        groups = await _play(c, cfg, encode, tasks, seed=call.seed, weights=weights)
    # Advantages within each group of whole episodes; a group with a failed one is dropped
    # (and its prompt index with it: each kept group keeps its task's index as its id).
    kept = [i for i, g in zip(call.indices, groups, strict=True) if all(r.ok for r in g)]
    episodes, dropped = records_to_episodes(
        groups,
        iter(kept),
        encode,
        scale=cfg.trainer.advantage_scale,
        turn_discount=cfg.env.turn_discount if cfg.env.credit == "turn" else None,
    )
    bookkeeping = lambda: metrics.record_records(groups, dropped)  # noqa: E731
    return await put_episodes(
        c, cfg, metrics, ledger, call, kept=kept, episodes=episodes, bookkeeping=bookkeeping
    )


def score_env_eval(
    step: int, tasks: Sequence[Task], groups: Sequence[Sequence[Record]]
) -> tuple[EvalResult, dict[str, float]] | None:
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
    result = EvalResult(
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

    async def run(step: int) -> EvalResult | None:
        tasks = source.eval_tasks(cfg.eval_prompts)
        seed = derive_seed(cfg.seed, "eval", step)
        groups = await _play(c, cfg, encode, tasks, seed=seed, weights=newest())
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
