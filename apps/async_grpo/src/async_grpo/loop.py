"""The controller: rollout loops, the training loop and the weight sync, run as one job.

Async and sync are one code path. Rollout loops generate episodes until the run ends; the
training loop samples batches no older than `max_policy_age` versions, trains, and hands
the new weights to a background sync. Before each episode a rollout loop waits until the
generators' weights are at most `max_policy_age` versions behind the trainer, so with
`max_policy_age=0` (`--mode sync`) generation pauses while the trainer steps and the weights
move: collect, train, sync, repeat. A rollout is one prompt and one response per episode
(`generate_episode`), or with `--env.tasks` whole multi-turn episodes against environment
services (`env_rollout.generate_env_episodes`).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any

from actor_service import NoHealthyReplicaError, ReplicaEvent
from replay_buffer import SampledBatch
from rl_envs import Warmup

from async_grpo import tracing
from async_grpo.actors.generator import Generator
from async_grpo.actors.reward import RewardActor
from async_grpo.actors.trainer import TrainResult
from async_grpo.components import Components, shutdown, spawn_components
from async_grpo.config import RunConfig
from async_grpo.env_rollout import env_eval, generate_env_episodes, make_encode
from async_grpo.environments import TaskSource
from async_grpo.evaluation import Evaluator, prompt_eval
from async_grpo.metrics import MetricsSink, RunMetrics, StepRow
from async_grpo.model import load_tokenizer
from async_grpo.prepare import Prepared
from async_grpo.rollout import to_episodes
from async_grpo.tasks import Sample, eval_set
from async_grpo.weight_sync import WeightSync, WeightUpdate, oldest


class Versions:
    """The trainer's version (in sync mode, the one its running step produces) and the
    oldest version a generator replica runs, with a condition the rollout loops wait on."""

    def __init__(self) -> None:
        self.trainer = 0
        self.generators = 0
        self.stopped = False
        self._changed = asyncio.Condition()

    async def set(self, *, trainer: int | None = None, generators: int | None = None) -> None:
        async with self._changed:
            self.trainer = trainer if trainer is not None else self.trainer
            self.generators = generators if generators is not None else self.generators
            self._changed.notify_all()

    async def stop(self) -> None:
        """Ends the run for every waiter: `wait_fresh` returns at once from now on."""
        async with self._changed:
            self.stopped = True
            self._changed.notify_all()

    async def wait_generators(self, version: int) -> None:
        """Returns once every generator runs `version` or newer."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.generators >= version)

    async def wait_fresh(self, max_age: int) -> None:
        """Returns once generators are at most `max_age` versions behind the trainer."""
        async with self._changed:
            await self._changed.wait_for(
                lambda: self.stopped or self.trainer - self.generators <= max_age
            )


async def generate_episode(
    c: Components, cfg: RunConfig, metrics: RunMetrics, group_ids: itertools.count[int]
) -> int:
    """One rollout: prompts -> a group of responses per prompt -> rewards -> advantages ->
    the replay buffer. Returns the episodes put there."""
    # Prompts and their targets.
    with tracing.span("prompts", track="rollout"):
        samples = await c.dataset.sample.call_one(cfg.generator.prompts_per_call)
    # group_size responses per prompt, all from one replica and one policy version.
    with tracing.span("generate", track="rollout", prompts=len(samples)):
        groups = await c.generator.endpoint(Generator.generate).route([s.prompt for s in samples])
    # Rewards for every response.
    completions = [comp for group in groups for comp in group]
    targets = [s.target for s, group in zip(samples, groups, strict=True) for _ in group]
    with tracing.span("reward", track="rollout", responses=len(completions)):
        rewards = await c.reward.endpoint(RewardActor.score).route(
            [comp.text for comp in completions], targets
        )
    # Advantages relative to the other answers to the same prompt, into the buffer as whole
    # groups; `put` waits while the buffer is full (admission control).
    episodes = to_episodes(groups, rewards, group_ids, scale_by_std=cfg.trainer.scale_by_std)
    with tracing.span("put", track="rollout", episodes=len(episodes)):
        await c.buffer.put.call_one(episodes)
    metrics.record_episodes(completions, targets, rewards)
    return len(episodes)


Rollout = Callable[[], Awaitable[int]]
"""One rollout into the buffer; returns the episodes put there."""


async def rollout_loop(
    cfg: RunConfig, versions: Versions, rollout: Rollout, warmup: Warmup
) -> None:
    while not versions.stopped:
        with tracing.span("wait_fresh", track="rollout", wait=True):
            await versions.wait_fresh(cfg.effective_max_policy_age)
        with tracing.span("episode", track="rollout"):
            warmup.record(await rollout())


async def sync_weights(c: Components, update: WeightUpdate) -> WeightSync:
    """Every generator replica pulls `update` (or newer); returns the oldest version they
    run (with every transport used). The trainer may then reuse the staging of versions
    older than that one: the newest stays staged for a replica that comes back after a
    death."""
    syncs: list[WeightSync] = await c.generator.endpoint(Generator.update_weights).fanout(update)
    synced = oldest(syncs)
    if synced.version > 0:
        await c.trainer.release(synced.version - 1)
    return synced


class WeightBroadcast:
    """The newest weights, on their way to every generator replica.

    `offer` queues a new version; `run` applies the newest queued one with one fanout at a
    time (versions published meanwhile are folded into the next fanout). A replica that
    comes back after a death runs its initial weights, so `resend` queues the newest
    version again; a fanout that found no live replica waits for that.
    """

    def __init__(self) -> None:
        self.newest: WeightUpdate | None = None
        self._queue: asyncio.Queue[WeightUpdate] = asyncio.Queue()

    def offer(self, update: WeightUpdate) -> None:
        self.newest = update
        self._queue.put_nowait(update)

    def resend(self) -> None:
        if self.newest is not None:
            self._queue.put_nowait(self.newest)

    async def run(self, c: Components, versions: Versions, metrics: RunMetrics) -> None:
        while True:
            update = await self._queue.get()
            while not self._queue.empty():
                update = self._queue.get_nowait()
            start = time.perf_counter()
            try:
                with tracing.span("sync", track="weight_sync", version=update.version):
                    synced = await sync_weights(c, update)
            except NoHealthyReplicaError:
                continue  # every replica died under the fanout: each one back is resent to
            metrics.last_sync_s = time.perf_counter() - start
            metrics.last_sync_transport = synced.transport
            await versions.set(generators=synced.version)


StepCallback = Callable[[StepRow, TrainResult], None]


async def training_loop(
    c: Components,
    cfg: RunConfig,
    versions: Versions,
    metrics: RunMetrics,
    weights: WeightBroadcast,
    *,
    evaluator: Evaluator,
    warmup: Warmup,
    on_step: StepCallback,
) -> int:
    """Trains until `cfg.steps` steps, `cfg.max_minutes` or `cfg.stop_at_reward`; returns
    the last version."""
    deadline = time.perf_counter() + cfg.max_minutes * 60
    version = 0
    # The warm-up fill (`buffer.warmup_episodes`) is collected before the first step.
    with tracing.span("warmup", track="train", wait=True):
        await warmup.wait()
    next_batch = _request_batch(c, cfg, version)
    while version < cfg.steps and time.perf_counter() < deadline:
        # A batch of whole groups, none older than max_policy_age versions; the buffer
        # answers as soon as the episode that completes one arrives.
        with tracing.span("sample_wait", track="train", wait=True, version=version):
            batch = await next_batch
        if batch is None:
            next_batch = _request_batch(c, cfg, version)
            continue
        episodes = list(batch.episodes)
        # The next step's batch is gathered while this one trains: it may only hold episodes
        # fresh enough for the weights this step produces (version + 1).
        next_batch = _request_batch(c, cfg, version + 1)
        if cfg.effective_max_policy_age == 0:
            # Sync: nothing generated on the outgoing weights could be trained on, so
            # rollouts wait from now, not from the step's end. (With a staleness bound the
            # generators' version as the controller sees it lags the replicas' by a sync in
            # flight; waiting on it would idle them: 1142 -> 939 trained episodes/s.)
            await versions.set(trainer=version + 1)
        # Reference log-probs for the KL term, when it is on.
        if c.reference:
            with tracing.span("reference", track="train"):
                ref = await c.reference.logprobs.call_one(episodes)
        else:
            ref = None
        # One GRPO step; the trainer stages the new weights before it returns.
        with tracing.span("train_step", track="train", version=version + 1):
            result = await c.trainer.train_step(episodes, ref)
        version = result.version
        # New weights go to the generators in the background; rollouts may proceed.
        weights.offer(result.update)
        await versions.set(trainer=version)
        # Now and then an evaluation of the policy, in the background; the step's record.
        if cfg.eval_every and version % cfg.eval_every == 0:
            evaluator.request(version)
        on_step(metrics.step_row(result, episodes, cfg.sampling.group_size), result)
        if 0 < cfg.stop_at_reward <= metrics.reward_window() and metrics.window_full():
            break
    next_batch.cancel()
    return version


def _request_batch(
    c: Components, cfg: RunConfig, version: int
) -> asyncio.Future[SampledBatch | None]:
    """Asks the buffer for a batch for the trainer at `version`; waits at most 1 s there."""
    return asyncio.ensure_future(
        c.buffer.sample_wait.call_one(version, cfg.trainer.batch_size, 1.0)
    )


def replica_event_recorder(
    metrics: RunMetrics, weights: WeightBroadcast, log: Callable[[str], None]
) -> Callable[[ReplicaEvent], None]:
    """Prints one line per replica death, return or abandonment and counts them; a
    generator replica that is back gets the newest weights."""

    def record(event: ReplicaEvent) -> None:
        who = f"{event.service} replica {event.replica}"
        if event.kind == "died":
            metrics.replica_deaths += 1
            log(f"[{who} died: {event.reason}; restarting it]")
        elif event.kind == "up":
            metrics.replica_restarts += 1
            log(f"[{who} is back after {event.down_s or 0.0:.1f}s (restart {event.restarts})]")
            if event.service == "generator":
                weights.resend()
        else:
            log(f"[{who} stays down after {event.restarts} restarts: {event.reason}]")

    return record


async def run_job(
    cfg: RunConfig,
    prep: Prepared,
    sink: MetricsSink,
    on_step: StepCallback,
    metrics: RunMetrics,
    *,
    log: Callable[[str], None] = print,
) -> None:
    """Runs the whole job, recording into `metrics`; every process started is stopped on
    return, error or Ctrl-C."""
    weights = WeightBroadcast()
    c = await spawn_components(cfg, prep, replica_event_recorder(metrics, weights, log))
    versions = Versions()
    warmup = Warmup(cfg.buffer.warmup_episodes)
    group_ids = itertools.count()
    rollout: Rollout
    if cfg.env.tasks:
        # Whole episodes against the environment services, tasks drawn in the controller.
        source = TaskSource(cfg.env, cfg.seed)
        encode = make_encode(load_tokenizer(prep.model_path))
        evaluator = Evaluator(env_eval(c, cfg, source, encode, log), metrics)

        def rollout() -> Awaitable[int]:
            return generate_env_episodes(c, cfg, metrics, group_ids, source=source, encode=encode)
    else:
        evaluator = Evaluator(prompt_eval(c.generator, c.reward, eval_set_for(cfg, prep)), metrics)

        def rollout() -> Awaitable[int]:
            return generate_episode(c, cfg, metrics, group_ids)

    tasks: list[asyncio.Task[Any]] = []
    try:
        # Generators start from exactly the weights the trainer holds (version 0).
        weights.newest = await c.trainer.publish_initial()
        metrics.last_sync_transport = (await sync_weights(c, weights.newest)).transport
        if cfg.eval_every:
            await evaluator.evaluate(0)  # the starting point every later evaluation is read against

        def step(row: StepRow, result: TrainResult) -> None:
            sink.write(row)
            on_step(row, result)

        # Rollouts, the weight sync and the trainer run concurrently from here.
        rollouts = [
            asyncio.create_task(rollout_loop(cfg, versions, rollout, warmup))
            for _ in range(cfg.rollout_loops)
        ]
        sync = asyncio.create_task(weights.run(c, versions, metrics))
        trainer = asyncio.create_task(
            training_loop(
                c, cfg, versions, metrics, weights, evaluator=evaluator, warmup=warmup, on_step=step
            )
        )
        tasks = [*rollouts, sync, trainer]
        # The first task to finish is the trainer (done) or a loop that failed.
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            t.result()  # re-raises a failure
        last = trainer.result()
        # Training is over: stop generating, let the generators take the final weights, and
        # evaluate those once more.
        await versions.stop()
        await _cancel(rollouts)
        if cfg.eval_every:
            await versions.wait_generators(last)
            await evaluator.final(last)
    finally:
        await versions.stop()
        evaluator.cancel()
        await _cancel(tasks)
        await shutdown(c)


async def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def eval_set_for(cfg: RunConfig, prep: Prepared) -> list[Sample]:
    d = cfg.data
    return eval_set(d.task, d.min_n, d.max_n, prep.samples or (), size=cfg.eval_prompts)
