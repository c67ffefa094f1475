"""The controller's loops, side by side. RL here is two loops joined by the replay buffer,
and a third that carries the weights back:

    rollout_loop    (x rollout_loops)  a call of prompts -> episodes into the buffer
    training_loop                      a batch from the buffer -> one GRPO step, a version
    broadcast_loop                     each new version -> every generator replica

Async and sync are one code path: they differ in the staleness bound (`max_policy_age`; 0
in sync mode, where the ledger also hands out exactly one batch of prompts per version:
collect, train, sync, repeat). `run_loops` runs them together until training ends, or until
the trainer dies (`TrainerDied`; `job.py` restores it and runs them again).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import Callable
from typing import Any

from actor_service import NoHealthyReplicaError
from replay_buffer import EpisodeBatch, GroupId, SampledBatch, Warmup

from async_grpo import tracing
from async_grpo.actors.buffer import BufferActor
from async_grpo.actors.reference import ReferenceModel
from async_grpo.actors.trainer import TrainResult
from async_grpo.controller.broadcast import sync_weights
from async_grpo.controller.context import Job
from async_grpo.controller.rollout import Rollout
from async_grpo.launch.trainer import TrainerDied
from async_grpo.observability.metrics import StepRow

RecordStep = Callable[[StepRow, TrainResult, list[int]], None]
"""Writes a step's row and the prompts (group ids) it trained on."""


async def rollout_loop(job: Job, rollout: Rollout, warmup: Warmup) -> None:
    """Consumes calls of prompts from the ledger. Waits at the staleness gate: until the
    generators' weights are at most `max_policy_age` versions behind the trainer's (and, in
    sync mode, the version's batch has room). Unblocks the training loop: episodes in the
    buffer, and the warm-up count."""
    draw = job.tasks.draw if job.tasks is not None else None
    while True:
        with tracing.span("wait_fresh", track="rollout", wait=True):
            call = await job.gate.admit(job.ledger, draw)
        if call is None:
            return
        with tracing.span("episode", track="rollout"):
            warmup.record(await rollout(call))
        await job.gate.notify()  # a dropped group frees room in sync mode's batch


async def training_loop(job: Job, warmup: Warmup, record: RecordStep) -> int:
    """Consumes batches of whole groups, none older than `max_policy_age` versions. Waits on
    the warm-up fill once, then on each batch (the next one is asked for while a step
    trains; in async mode, when it comes first, it is sent to queue behind the step, so the
    trainer goes on without waiting for the controller). Unblocks the broadcast loop (a new
    version), the rollouts waiting at the gate, and every `checkpoint.every` steps a
    checkpoint. Ends after `steps`, `max_minutes`, `stop_at_reward` or a stop request, with
    a checkpoint; returns the last version."""
    cfg, ledger, stop = job.cfg, job.ledger, job.stop.event
    deadline = time.perf_counter() + cfg.max_minutes * 60
    version = job.gate.trainer
    reached = False  # `stop_at_reward`

    def may_start(v: int) -> bool:
        return (
            v < cfg.steps and time.perf_counter() < deadline and not stop.is_set() and not reached
        )

    with tracing.span("warmup", track="train", wait=True):
        await warmup.wait()
    job.gate.warmup_groups = 0
    next_batch: asyncio.Future[SampledBatch | None] | None = None
    step: SentStep | None = None  # sent to the trainer, not answered yet
    queued: SentStep | None = None  # sent behind it
    try:
        while step is not None or may_start(version):
            if step is None:
                next_batch = next_batch or await _request_batch(job, version)
                with tracing.span("sample_wait", track="train", wait=True, version=version):
                    batch = await _unless_stopped(next_batch, stop)
                next_batch = None if next_batch.done() else next_batch
                if batch is None:  # the buffer had none within its wait, or a stop came first
                    continue
                step = await _send_step(job, batch)
            # The next batch is gathered while this step trains, unless a checkpoint follows:
            # its cut must not miss a batch on its way.
            if (
                next_batch is None
                and may_start(version + 1)
                and not job.checkpoints.due(version + 1)
            ):
                next_batch = await _request_batch(job, version + 1)
            # Queued behind this step in async mode; not while a checkpoint is written: the
            # trainer confirms the write between two steps (`saved`), which a step queued
            # right behind another would starve.
            queue = cfg.effective_max_policy_age > 0 and not job.checkpoints.writing
            if next_batch is not None and queue:
                await asyncio.wait({next_batch, step.answer}, return_when=asyncio.FIRST_COMPLETED)
                if next_batch.done() and may_start(version + 1):
                    batch, next_batch = next_batch.result(), None
                    queued = await _send_step(job, batch) if batch is not None else None
            with tracing.span("train_step", track="train", version=version + 1):
                result = await job.components.trainer.finish_step(step.answer)
            version = result.version
            ledger.trained(step.groups)
            held = ledger.held() * cfg.sampling.group_size
            row = job.metrics.step_row(result, step.episodes, cfg.sampling.group_size, held)
            if job.checkpoints.due(version):
                row = job.metrics.held_for_checkpoint(await job.checkpoints.take(job, version))
            record(row, result, step.groups)
            # The gate first: a rollout it admits sends its generation request (bringing
            # these weights) before the broadcast's fanout, so the generator pulls them for
            # the request instead of handling the fanout's message in front of it.
            await job.gate.step_ended(version)
            job.weights.offer(result.update)
            if cfg.eval_every and version % cfg.eval_every == 0:
                job.evaluator.request(version)  # in the background
            if 0 < cfg.stop_at_reward <= job.metrics.reward_window() and job.metrics.window_full():
                reached = True
            step, queued = queued, None
    finally:
        for sent in (step, queued):  # unanswered only when the loop failed: nobody waits
            if sent is not None and not sent.answer.cancel() and not sent.answer.cancelled():
                sent.answer.exception()  # already failed with the trainer: seen
    if next_batch is not None:  # a batch on its way is not trained: its prompts go back
        leftover = await next_batch
        ledger.untrained(_in_group_order(leftover.batch)[1] if leftover else [])
    if job.checkpoints.taken != version:
        await job.checkpoints.take(job, version)
    await job.checkpoints.finish()
    return version


@dataclasses.dataclass(frozen=True)
class SentStep:
    """A train step sent to the trainer: its batch (in group order), the batch's group ids,
    and its answer to come."""

    episodes: EpisodeBatch
    groups: list[int]
    answer: asyncio.Future[Any]


async def _send_step(job: Job, batch: SampledBatch) -> SentStep:
    """Sends a step on `batch` to the trainer (with the reference log-probs when the loss
    has a KL term); the trainer starts it once the steps sent before it are done."""
    episodes, groups = _in_group_order(batch.batch)
    # Groups taken before their put was booked are counted as generated now.
    job.metrics.fates.generated += job.ledger.batch_taken(groups) * job.cfg.sampling.group_size
    job.gate.step_started()
    ref = None
    if job.components.reference is not None:
        with tracing.span("reference", track="train"):
            ref = await job.components.reference.endpoint(ReferenceModel.logprobs).route(episodes)
    return SentStep(episodes, groups, job.components.trainer.start_step(episodes, ref))


async def broadcast_loop(job: Job) -> None:
    """Consumes the versions the training loop offers, only the newest of those waiting.
    Waits on every generator replica pulling it (one fanout at a time). Unblocks the
    rollouts waiting at the gate for fresher generator weights."""
    while True:
        update = await job.weights.next()
        start = time.perf_counter()
        try:
            with tracing.span("sync", track="weight_sync", version=update.version):
                synced = await sync_weights(job.components, update)
        except NoHealthyReplicaError:
            continue  # every replica died under the fanout: each one back is resent to
        job.metrics.last_sync_s = time.perf_counter() - start
        job.metrics.last_pull_s = synced.seconds
        # A replica that already pulled this version (a generate request brought it) moves
        # nothing and names no transport; the row keeps the last one that did.
        job.metrics.last_sync_transport = synced.transport or job.metrics.last_sync_transport
        await job.gate.set(generators=synced.version)


async def run_loops(job: Job, rollout: Rollout, record: RecordStep) -> int:
    """The rollout loops, the broadcast loop and the training loop, concurrently, until
    training ends (then the final evaluation); returns the last version. Raises
    `TrainerDied` when the trainer died, whichever loop noticed first."""
    warmup = Warmup(job.cfg.buffer.warmup_episodes)
    group_size = job.cfg.sampling.group_size
    job.gate.warmup_groups = -(-warmup.remaining // group_size)  # the fill, in whole groups
    rollouts = [
        asyncio.create_task(rollout_loop(job, rollout, warmup))
        for _ in range(job.cfg.rollout_loops)
    ]
    broadcast = asyncio.create_task(broadcast_loop(job))
    trainer = asyncio.create_task(training_loop(job, warmup, record))
    tasks = [*rollouts, broadcast, trainer]
    try:
        # The first task to finish is the trainer (done) or a loop that failed.
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in done:
            t.result()  # re-raises a failure
        last = trainer.result()
        # Training is over: stop generating, let the generators take the final weights, and
        # evaluate those once more.
        await cancel_tasks(rollouts)
        if job.cfg.eval_every and not job.stop.event.is_set():
            await job.gate.wait_generators(last)
            await job.evaluator.final(last)
        return last
    except TrainerDied:
        raise
    except Exception as e:
        # A generator pulling weights from a trainer that just died fails first: ask it.
        death = await _trainer_death(job)
        if death is not None:
            raise death from e
        raise
    finally:
        await cancel_tasks(tasks)


async def _request_batch(job: Job, version: int) -> asyncio.Future[SampledBatch | None]:
    """Asks the buffer for a batch for the trainer at `version` (it waits at most 1 s there).
    The buffer evicts what is too stale for `version` at this request: so does the ledger,
    counting them, which frees room in the admission window."""
    group_size = job.cfg.sampling.group_size
    for stale in job.ledger.evict_stale(version, job.cfg.effective_max_policy_age):
        job.metrics.fates.record_stale(group_size, stale.age, stale.tokens)
    await job.gate.notify()
    buffer = job.components.buffer.endpoint(BufferActor.sample_wait)
    return asyncio.ensure_future(buffer.route(version, job.cfg.trainer.batch_size, 1.0))


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


def _in_group_order(batch: EpisodeBatch) -> tuple[EpisodeBatch, list[int]]:
    """The batch ordered by group id (a stable sort keeps each group's order), and its
    group ids: the same batch in every run, whichever group arrived first. A batch already
    in order (its groups were put in the order they were drawn) is passed on as the record
    it arrived as: the controller neither unpacks nor packs it again."""
    ids = [_group(g) for g in batch.group_ids()]
    if any(a > b for a, b in itertools.pairwise(ids)):
        batch = EpisodeBatch(sorted(batch, key=lambda e: _group(e.group_id)))
    return batch, sorted(set(ids))


def _group(group_id: GroupId | None) -> int:
    """An episode's group id: its prompt's index in the run (`ledger.py`)."""
    assert isinstance(group_id, int)
    return group_id


# A live trainer answers after the step it is computing; a dead one is reported by Monarch
# within its supervision poll, or after its own timeouts when a host agent is slow to answer.
TRAINER_PING_TIMEOUT_S = 180.0


async def _trainer_death(job: Job) -> TrainerDied | None:
    """None if the trainer answers, else how it died (or that it does not answer)."""
    try:
        await asyncio.wait_for(job.components.trainer.pids(), TRAINER_PING_TIMEOUT_S)
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
