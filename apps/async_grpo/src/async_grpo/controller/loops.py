"""The controller's loops: rollout loops, the training loop and the weight sync, run
together for one phase of a run (`controller.py` runs the phases).

Async and sync are one code path. Rollout loops generate episodes until the run ends; the
training loop samples batches no older than `max_policy_age` versions, trains, and hands
the new weights to a background sync (`broadcast.py`). Before each call of prompts a
rollout loop waits until the generators' weights are at most `max_policy_age` versions
behind the trainer, and takes the call from the prompt ledger (`ledger.py`), which in sync
mode (`max_policy_age=0`) hands out exactly one batch of prompts per version: collect,
train, sync, repeat. A rollout is one prompt and one response per episode
(`generate_episode`), or with `--env.tasks` whole multi-turn episodes against environment
services (`env_rollout.generate_env_episodes`).

Every `--checkpoint.every` steps, at the end and on Ctrl-C / SIGTERM the training loop
takes a checkpoint at the cut between two steps (`checkpointing.py`). A phase ends when
training does, or with `TrainerDied` when the trainer dies.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from replay_buffer import Episode, SampledBatch
from rl_envs import Warmup

from async_grpo import tracing
from async_grpo.actors.buffer import BufferActor
from async_grpo.actors.dataset import DatasetActor
from async_grpo.actors.generator import Generator
from async_grpo.actors.reference import ReferenceModel
from async_grpo.actors.reward import RewardActor
from async_grpo.actors.trainer import TrainResult
from async_grpo.components import Components
from async_grpo.config import RunConfig
from async_grpo.faults import TrainerDied
from async_grpo.job import Run
from async_grpo.ledger import Call, Draw, PromptLedger
from async_grpo.metrics import RunMetrics, StepRow
from async_grpo.rollout import to_episodes
from async_grpo.weight_sync import WeightUpdate

Rollout = Callable[[Call], Awaitable[int]]
"""One rollout of a call's prompts into the buffer; returns the episodes put there."""
Record = Callable[[StepRow, TrainResult, list[int]], None]
"""Writes a step's row and the prompts it trained on."""


async def generate_episode(
    c: Components,
    cfg: RunConfig,
    metrics: RunMetrics,
    ledger: PromptLedger,
    call: Call,
    *,
    weights: WeightUpdate | None,
) -> int:
    """One rollout: prompts -> a group of responses per prompt -> rewards -> advantages ->
    the replay buffer. Returns the episodes put there."""
    # Prompts and their targets, by index in the run's prompt stream.
    with tracing.span("prompts", track="rollout"):
        samples = await c.dataset.endpoint(DatasetActor.samples).route(list(call.indices))
    # group_size responses per prompt, all from one replica and one policy version (these
    # weights or newer), drawn with the call's seed.
    with tracing.span("generate", track="rollout", prompts=len(samples)):
        groups = await c.generator.endpoint(Generator.generate).route(
            [s.prompt for s in samples], call.seed, weights
        )
    # Rewards for every response.
    completions = [comp for group in groups for comp in group]
    targets = [s.target for s, group in zip(samples, groups, strict=True) for _ in group]
    with tracing.span("reward", track="rollout", responses=len(completions)):
        rewards = await c.reward.endpoint(RewardActor.score).route(
            [comp.text for comp in completions], targets
        )
    # Advantages relative to the other answers to the same prompt, into the buffer as whole
    # groups (a group's id is its prompt's index); `put` waits while the buffer is full.
    episodes = to_episodes(groups, rewards, iter(call.indices), scale=cfg.trainer.advantage_scale)
    bookkeeping = lambda: metrics.record_episodes(completions, targets, rewards)  # noqa: E731
    return await put_episodes(
        c, cfg, metrics, ledger, call, kept=call.indices, episodes=episodes, bookkeeping=bookkeeping
    )


async def put_episodes(
    c: Components,
    cfg: RunConfig,
    metrics: RunMetrics,
    ledger: PromptLedger,
    call: Call,
    *,
    kept: Sequence[int],
    episodes: list[Episode],
    bookkeeping: Callable[[], None],
) -> int:
    """The end of every rollout: the groups `kept` of `call` (`episodes`) into the buffer,
    the ledger told where they are, and `bookkeeping` (its episodes into the metrics) run in
    prompt order. Returns the episodes put there."""
    incarnation = ""
    if episodes:
        with tracing.span("put", track="rollout", episodes=len(episodes)):
            incarnation = await c.buffer.endpoint(BufferActor.put).route(episodes)
    version = min((e.policy_version for e in episodes), default=0)
    # Groups a buffer took just before it died are lost with it (and drawn again).
    lost = ledger.put(call, kept, version, incarnation)
    metrics.faults.episodes_lost += lost * cfg.sampling.group_size
    ledger.in_order(call, bookkeeping)
    return len(episodes)


async def rollout_loop(run: Run, rollout: Rollout, warmup: Warmup, draw: Draw | None) -> None:
    while True:
        with tracing.span("wait_fresh", track="rollout", wait=True):
            call = await run.versions.claim(run.ledger, run.cfg.effective_max_policy_age, draw)
        if call is None:
            return
        with tracing.span("episode", track="rollout"):
            warmup.record(await rollout(call))
        await run.versions.notify()  # a dropped group frees room in sync mode's batch


async def training_loop(run: Run, warmup: Warmup, record: Record) -> int:
    """Trains until `cfg.steps` steps, `cfg.max_minutes`, `cfg.stop_at_reward` or a stop
    request; ends with a checkpoint and returns the last version."""
    cfg, c, ledger, metrics, stop = run.cfg, run.c, run.ledger, run.metrics, run.stop.event
    deadline = time.perf_counter() + cfg.max_minutes * 60
    version = run.versions.trainer
    # The warm-up fill (`buffer.warmup_episodes`) is collected before the first step.
    with tracing.span("warmup", track="train", wait=True):
        await warmup.wait()
    next_batch: asyncio.Future[SampledBatch | None] | None = None
    while version < cfg.steps and time.perf_counter() < deadline and not stop.is_set():
        # A batch of whole groups, none older than max_policy_age versions; the buffer
        # answers as soon as the episode that completes one arrives.
        next_batch = next_batch or _request_batch(c, cfg, version)
        with tracing.span("sample_wait", track="train", wait=True, version=version):
            batch = await _unless_stopped(next_batch, stop)
        if batch is None:
            next_batch = None if next_batch.done() else next_batch
            continue
        episodes, groups = _in_group_order(batch.episodes)
        ledger.take(groups)
        ledger.evict_stale(version, cfg.effective_max_policy_age)
        # The next step's batch is gathered while this one trains (only episodes fresh
        # enough for the weights it produces), unless a checkpoint follows: its cut must not
        # miss a batch on its way.
        next_batch = (
            None if run.checkpoints.due(version + 1) else _request_batch(c, cfg, version + 1)
        )
        # Reference log-probs for the KL term, when it is on.
        ref = None
        if c.reference is not None:
            with tracing.span("reference", track="train"):
                ref = await c.reference.endpoint(ReferenceModel.logprobs).route(episodes)
        # One GRPO step; the trainer stages the new weights before it returns.
        with tracing.span("train_step", track="train", version=version + 1):
            result = await c.trainer.train_step(episodes, ref)
        version = result.version
        ledger.trained(groups)
        row = metrics.step_row(result, episodes, cfg.sampling.group_size)
        # Every checkpoint.every steps, a checkpoint at the cut before the next step.
        if run.checkpoints.due(version):
            row = metrics.held_for_checkpoint(await run.checkpoints.take(run, version))
        record(row, result, groups)
        # New weights go to the generators in the background; rollouts may proceed.
        run.weights.offer(result.update)
        await run.versions.set(trainer=version)
        # Now and then an evaluation of the policy, in the background.
        if cfg.eval_every and version % cfg.eval_every == 0:
            run.evaluator.request(version)
        if 0 < cfg.stop_at_reward <= metrics.reward_window() and metrics.window_full():
            break
    # The end: a batch still on its way is not trained (its prompts go back to the ledger),
    # then the last checkpoint.
    if next_batch is not None:
        leftover = await next_batch
        ledger.take(_in_group_order(leftover.episodes)[1] if leftover else [])
        ledger.untake()
    if run.checkpoints.taken != version:
        await run.checkpoints.take(run, version)
    await run.checkpoints.finish()
    return version


def _request_batch(
    c: Components, cfg: RunConfig, version: int
) -> asyncio.Future[SampledBatch | None]:
    """Asks the buffer for a batch for the trainer at `version`; waits at most 1 s there."""
    call = c.buffer.endpoint(BufferActor.sample_wait).route(version, cfg.trainer.batch_size, 1.0)
    return asyncio.ensure_future(call)


async def _unless_stopped(
    batch: asyncio.Future[SampledBatch | None], stop: asyncio.Event
) -> SampledBatch | None:
    """The batch, or None if a stop is requested first (the request stays outstanding)."""
    stopped: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
    either: set[asyncio.Future[Any]] = {batch, stopped}
    try:
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    return batch.result() if batch.done() else None


def _in_group_order(episodes: tuple[Episode, ...]) -> tuple[list[Episode], list[int]]:
    """The batch ordered by group id (a stable sort keeps each group's order), and its
    group ids: the same batch in every run, whichever group arrived first."""
    ordered = sorted(episodes, key=_group)
    return ordered, sorted({_group(e) for e in episodes})


def _group(episode: Episode) -> int:
    """The episode's group id: its prompt's index in the run (`ledger.py`)."""
    assert isinstance(episode.group_id, int)
    return episode.group_id


async def run_phase(run: Run, rollout: Rollout, draw: Draw | None, record: Record) -> int:
    """Rollouts, the weight sync and the trainer, concurrently, until training ends (then
    the final evaluation); returns the last version. Raises `TrainerDied` when the trainer
    died, whichever loop noticed first."""
    warmup = Warmup(run.cfg.buffer.warmup_episodes)
    rollouts = [
        asyncio.create_task(rollout_loop(run, rollout, warmup, draw))
        for _ in range(run.cfg.rollout_loops)
    ]
    sync = asyncio.create_task(run.weights.run(run.c, run.versions, run.metrics))
    trainer = asyncio.create_task(training_loop(run, warmup, record))
    tasks = [*rollouts, sync, trainer]
    try:
        # The first task to finish is the trainer (done) or a loop that failed.
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            t.result()  # re-raises a failure
        last = trainer.result()
        # Training is over: stop generating, let the generators take the final weights, and
        # evaluate those once more.
        await cancel_tasks(rollouts)
        if run.cfg.eval_every and not run.stop.event.is_set():
            await run.versions.wait_generators(last)
            await run.evaluator.final(last)
        return last
    except TrainerDied:
        raise
    except Exception as e:
        # A generator pulling weights from a trainer that just died fails first: ask it.
        death = await _trainer_death(run.c)
        if death is not None:
            raise death from e
        raise
    finally:
        await cancel_tasks(tasks)


# A live trainer answers after the step it is computing; a dead one is reported by Monarch
# within its supervision poll, or after its own timeouts when a host agent is slow to answer.
TRAINER_PING_TIMEOUT_S = 180.0


async def _trainer_death(c: Components) -> TrainerDied | None:
    """None if the trainer answers, else how it died (or that it does not answer)."""
    try:
        await asyncio.wait_for(c.trainer.pids(), TRAINER_PING_TIMEOUT_S)
    except TrainerDied as e:
        return e
    except TimeoutError:
        return TrainerDied(f"no answer within {TRAINER_PING_TIMEOUT_S:.0f} s")
    return None


async def cancel_tasks(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancels `tasks` and waits until each has ended."""
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
