"""The controller: spawn the components, run rollout loops and the training loop, report.

Async and sync are one code path. Rollout loops call `generate_episode` until the run ends;
the training loop samples batches no older than `max_policy_age` versions, trains, and hands
the new weights to a background sync. Before each episode a rollout loop waits until the
generators' weights are at most `max_policy_age` versions behind the trainer, so with
`max_policy_age=0` (`--mode sync`) generation pauses while the trainer steps and the weights
move: collect, train, sync, repeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import torch
from actor_service import Service, ServiceConfig, spawn_service
from monarch.actor import ProcMesh, this_host
from replay_buffer import Episode, ReplayBufferActor, ReplayBufferConfig, SampledBatch

from async_grpo.actors.dataset import DatasetActor
from async_grpo.actors.generator import Generator
from async_grpo.actors.reference import ReferenceModel
from async_grpo.actors.reward import RewardActor
from async_grpo.actors.trainer import TrainResult
from async_grpo.config import RunConfig
from async_grpo.evaluation import Evaluator
from async_grpo.grpo import group_advantages
from async_grpo.metrics import MetricsSink, RunMetrics, StepRow, Trajectory, batch_diagnostics
from async_grpo.prepare import Prepared
from async_grpo.tasks import Sample, eval_set
from async_grpo.trainer_client import TrainerClient, spawn_trainer
from async_grpo.weight_sync import WeightUpdate


@dataclasses.dataclass
class Components:
    """Handles to every running component (actor meshes and services)."""

    dataset: Any
    generator: Service[Generator]
    reward: Service[RewardActor]
    reference: Any | None
    buffer: Any
    trainer: TrainerClient
    procs: list[ProcMesh]


class Versions:
    """The trainer's version and the version every generator replica runs, with a condition
    the rollout loops wait on."""

    def __init__(self) -> None:
        self.trainer = 0
        self.generators = 0
        self.changed = asyncio.Condition()
        self.stop = False

    async def set(self, *, trainer: int | None = None, generators: int | None = None) -> None:
        async with self.changed:
            self.trainer = trainer if trainer is not None else self.trainer
            self.generators = generators if generators is not None else self.generators
            self.changed.notify_all()

    async def wait_generators(self, version: int) -> None:
        """Returns once every generator runs `version` or newer."""
        async with self.changed:
            await self.changed.wait_for(lambda: self.generators >= version)

    async def wait_fresh(self, max_age: int) -> None:
        """Returns once generators are at most `max_age` versions behind the trainer."""
        async with self.changed:
            await self.changed.wait_for(
                lambda: self.stop or self.trainer - self.generators <= max_age
            )


async def spawn_components(cfg: RunConfig, prep: Prepared) -> Components:
    """Starts each component in its own process (the services: one process per replica)."""
    procs: list[ProcMesh] = []

    def proc() -> ProcMesh:
        mesh = this_host().spawn_procs(per_host={"procs": 1})
        procs.append(mesh)
        return mesh

    buffer_cfg = ReplayBufferConfig(
        max_policy_age=cfg.buffer.max_policy_age if cfg.mode == "async" else 0,
        max_buffer_size=cfg.buffer.capacity,
        admission_limit=cfg.buffer.capacity,
        group_size=cfg.sampling.group_size,
        sampling="fifo",
        seed=cfg.seed,
    )
    dataset = proc().spawn("dataset", DatasetActor, cfg.data, prep.samples, cfg.seed)
    buffer = proc().spawn("replay_buffer", ReplayBufferActor, buffer_cfg)
    trainer = await spawn_trainer(cfg, prep.model_path, procs)
    reference = None
    if cfg.trainer.kl_coef > 0:
        reference = proc().spawn("reference", ReferenceModel, prep.model_path, cfg.sampling)
    generator, reward = await asyncio.gather(
        spawn_service(
            Generator,
            ServiceConfig(replicas=cfg.generator.replicas, name="generator"),
            prep.model_path,
            cfg.model,
            cfg.sampling,
            cfg.seed,
        ),
        spawn_service(
            RewardActor, ServiceConfig(replicas=cfg.reward.replicas, name="reward"), cfg.reward.fns
        ),
    )
    return Components(dataset, generator, reward, reference, buffer, trainer, procs)


async def shutdown(c: Components) -> None:
    """Stops every service and process this run started."""
    for svc in (c.generator, c.reward):
        with contextlib.suppress(Exception):
            await svc.shutdown()
    for mesh in c.procs:
        with contextlib.suppress(Exception):
            await mesh.stop()


async def generate_episode(
    c: Components, cfg: RunConfig, group_ids: itertools.count[int]
) -> tuple[list[Trajectory], int]:
    """One rollout: prompts -> a group of responses per prompt -> rewards -> advantages ->
    the replay buffer. Returns what to display and the number of tokens generated."""
    # Prompts and their targets.
    samples = await c.dataset.sample.call_one(cfg.generator.prompts_per_call)
    # group_size responses per prompt, all from one replica and one policy version.
    groups = await c.generator.endpoint(Generator.generate).route([s.prompt for s in samples])
    # Rewards for every response.
    flat = [(s, comp) for s, group in zip(samples, groups, strict=True) for comp in group]
    rewards = await c.reward.endpoint(RewardActor.score).route(
        [comp.text for _, comp in flat], [s.target for s, _ in flat]
    )
    # Advantages relative to the other answers to the same prompt.
    advantages = group_advantages(
        torch.tensor(rewards), cfg.sampling.group_size, scale_by_std=cfg.trainer.scale_by_std
    ).tolist()
    # Into the buffer, whole groups; waits here when the buffer is full (admission control).
    episodes: list[Episode] = []
    for k, (_, comp) in enumerate(flat):
        if k % cfg.sampling.group_size == 0:
            group = next(group_ids)
        episodes.append(
            Episode(
                prompt_ids=torch.tensor(comp.prompt_ids, dtype=torch.long),
                response_ids=torch.tensor(comp.response_ids, dtype=torch.long),
                behavior_logprobs=torch.tensor(comp.logprobs, dtype=torch.float32),
                reward=rewards[k],
                advantage=advantages[k],
                policy_version=comp.policy_version,
                group_id=group,
            )
        )
    await c.buffer.put.call_one(episodes)
    shown = [
        Trajectory(s.prompt, comp.text, s.target, r, comp.policy_version)
        for (s, comp), r in zip(flat, rewards, strict=True)
    ]
    return shown, sum(len(comp.response_ids) for _, comp in flat)


async def rollout_loop(
    c: Components,
    cfg: RunConfig,
    versions: Versions,
    metrics: RunMetrics,
    ids: itertools.count[int],
) -> None:
    max_age = cfg.buffer.max_policy_age if cfg.mode == "async" else 0
    while not versions.stop:
        await versions.wait_fresh(max_age)
        shown, tokens = await generate_episode(c, cfg, ids)
        metrics.record_episodes(shown, tokens)


async def sync_weights(c: Components, update: WeightUpdate) -> int:
    """Every generator replica pulls `update` (or newer); returns the oldest version they run.
    The trainer may then reuse the staging of that version and older ones."""
    syncs = await c.generator.endpoint(Generator.update_weights).fanout(update)
    version = min(s.version for s in syncs)
    await c.trainer.synced(version)
    return version


async def weight_sync_loop(
    c: Components, versions: Versions, latest: asyncio.Queue[WeightUpdate], metrics: RunMetrics
) -> None:
    """Applies the newest weights to every generator replica, one fanout at a time; versions
    published meanwhile are folded into the next fanout."""
    while True:
        update = await latest.get()
        while not latest.empty():
            update = latest.get_nowait()
        start = time.perf_counter()
        version = await sync_weights(c, update)
        metrics.last_sync_s = time.perf_counter() - start
        await versions.set(generators=version)


StepCallback = Callable[[StepRow, TrainResult], None]


async def training_loop(
    c: Components,
    cfg: RunConfig,
    versions: Versions,
    metrics: RunMetrics,
    latest: asyncio.Queue[WeightUpdate],
    *,
    evaluator: Evaluator,
    on_step: StepCallback,
) -> int:
    """Trains until `cfg.steps` steps, `cfg.max_minutes` or `cfg.stop_at_reward`; returns
    the last version."""
    deadline = time.perf_counter() + cfg.max_minutes * 60
    version = 0
    next_batch = _request_batch(c, cfg, version)
    while version < cfg.steps and time.perf_counter() < deadline:
        # A batch of whole groups, none older than max_policy_age versions; the buffer
        # answers as soon as the episode that completes one arrives.
        batch = await next_batch
        if batch is None:
            next_batch = _request_batch(c, cfg, version)
            continue
        episodes = list(batch.episodes)
        # The next step's batch is gathered while this one trains: it may only hold episodes
        # fresh enough for the weights this step produces (version + 1).
        next_batch = _request_batch(c, cfg, version + 1)
        # Reference log-probs for the KL term, when it is on.
        ref = None
        if c.reference is not None:
            pairs = [(e.prompt_ids.tolist(), e.response_ids.tolist()) for e in episodes]
            ref = await c.reference.logprobs.call_one(pairs)
        # One GRPO step; the trainer stages the new weights before it returns.
        result = await c.trainer.train_step(episodes, ref)
        version = result.version
        # New weights go to the generators in the background; rollouts may proceed.
        latest.put_nowait(result.weights)
        await versions.set(trainer=version)
        # Metrics, and now and then an evaluation of the policy in the background.
        if cfg.eval_every and version % cfg.eval_every == 0:
            evaluator.request(version)
        metrics.record_step(len(episodes), result.train_s + result.publish_s)
        eps, tps, idle = metrics.rates()
        ages = [version - 1 - e.policy_version for e in episodes]
        uniform, logprob = batch_diagnostics(episodes, cfg.sampling.group_size)
        last_eval = metrics.last_eval
        on_step(
            StepRow(
                step=version,
                version=version,
                wall_s=time.perf_counter() - metrics.start,
                reward_window=metrics.reward_window(),
                exact_window=sum(metrics.exact) / max(1, len(metrics.exact)),
                episodes_generated=metrics.episodes_generated,
                episodes_trained=metrics.episodes_trained,
                episodes_per_s=eps,
                tokens_per_s=tps,
                trainer_idle_frac=idle,
                weight_sync_s=metrics.last_sync_s,
                staleness_mean=sum(ages) / len(ages),
                loss=result.stats.loss,
                kl=result.stats.kl,
                clip_frac=result.stats.clip_frac,
                grad_norm=result.grad_norm,
                lr=result.lr,
                uniform_groups=uniform,
                behaviour_logprob=logprob,
                entropy=result.stats.entropy,
                eval_reward=last_eval.reward if last_eval else None,
                eval_version=last_eval.version if last_eval else None,
            ),
            result,
        )
        full = metrics.window_full()
        if cfg.stop_at_reward > 0 and full and metrics.reward_window() >= cfg.stop_at_reward:
            break
    next_batch.cancel()
    return version


def _request_batch(
    c: Components, cfg: RunConfig, version: int
) -> asyncio.Future[SampledBatch | None]:
    """Asks the buffer for a batch for the trainer at `version`; waits at most 1 s there."""
    call: Awaitable[SampledBatch | None] = c.buffer.sample_wait.call_one(
        version, cfg.trainer.batch_size, 1.0
    )
    return asyncio.ensure_future(call)


async def train(
    cfg: RunConfig, prep: Prepared, sink: MetricsSink, on_step: StepCallback, metrics: RunMetrics
) -> None:
    """Runs the whole job, recording into `metrics`; every process started is stopped on
    return, error or Ctrl-C."""
    c = await spawn_components(cfg, prep)
    versions = Versions()
    latest: asyncio.Queue[WeightUpdate] = asyncio.Queue()
    evaluator = Evaluator(c.generator, c.reward, eval_set_for(cfg, prep), metrics)
    rollouts: list[asyncio.Task[None]] = []
    sync: asyncio.Task[None] | None = None
    trainer: asyncio.Task[int] | None = None
    try:
        # Generators start from exactly the weights the trainer holds (version 0).
        await sync_weights(c, await c.trainer.publish_initial())
        if cfg.eval_every:
            await evaluator.evaluate(0)  # the starting point every later evaluation is read against

        def step(row: StepRow, result: TrainResult) -> None:
            sink.write(row)
            on_step(row, result)

        ids = itertools.count()
        rollouts = [
            asyncio.create_task(rollout_loop(c, cfg, versions, metrics, ids))
            for _ in range(cfg.rollout_loops)
        ]
        sync = asyncio.create_task(weight_sync_loop(c, versions, latest, metrics))
        trainer = asyncio.create_task(
            training_loop(c, cfg, versions, metrics, latest, evaluator=evaluator, on_step=step)
        )
        # The first task to finish is the trainer (done) or a rollout that failed.
        done, _ = await asyncio.wait(
            [trainer, sync, *rollouts], return_when=asyncio.FIRST_COMPLETED
        )
        for t in done:
            t.result()  # re-raises a failure
        last = trainer.result()
        # Training is over: stop generating, let the generators take the final weights, and
        # evaluate those once more.
        versions.stop = True
        await _cancel(rollouts)
        if cfg.eval_every:
            await versions.wait_generators(last)
            await evaluator.final(last)
    finally:
        versions.stop = True
        evaluator.cancel()
        await _cancel([*rollouts, *(t for t in (sync, trainer) if t is not None)])
        await shutdown(c)


async def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def eval_set_for(cfg: RunConfig, prep: Prepared) -> list[Sample]:
    d = cfg.data
    return eval_set(d.task, d.min_n, d.max_n, prep.samples or (), size=cfg.eval_prompts)
