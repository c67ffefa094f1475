"""What the run does when one of its processes dies (`docs/09_fault_tolerance.md`).

- A service replica (generator, reward, environment, dataset, reference) dies or hangs:
  its service restarts it and sends its calls again (`actor-service`); a generator back
  from the dead pulls the newest weights before it serves. One line when it dies, one when
  it is back, both counted (`replica_event_recorder`).
- The replay buffer dies: its service starts a fresh one and sends the puts and the
  trainer's request in flight again; the groups it held are lost, and the prompt ledger
  queues their prompts to be generated again (nothing skipped, nothing trained twice).
- The trainer dies: `restore_trainer` rolls the whole run back to its newest checkpoint
  (or its start): a new trainer loads it, the buffer, the ledger and the metrics return to
  that cut, and every generator pulls its weights. The steps since are trained again, from
  the same prompts.
- The controller dies: `uv run async-grpo --resume` continues from the newest checkpoint.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from actor_service import ReplicaEvent

from async_grpo.actors.buffer import BufferActor
from async_grpo.config.schema import RunConfig
from async_grpo.controller.broadcast import WeightBroadcast, sync_weights
from async_grpo.controller.context import Job
from async_grpo.controller.cut import Cut, read_cut
from async_grpo.controller.ledger import PromptLedger
from async_grpo.controller.staleness import StalenessGate
from async_grpo.launch.spawn import buffer_config
from async_grpo.launch.trainer import spawn_trainer
from async_grpo.observability.crashes import crash_note, read_crashes
from async_grpo.observability.metrics import RunMetrics
from async_grpo.observability.stuck import record_stuck, stuck_line


def replica_event_recorder(
    cfg: RunConfig,
    *,
    metrics: RunMetrics,
    ledger: PromptLedger,
    weights: WeightBroadcast,
    gate: StalenessGate,
    log: Callable[[str], None],
) -> Callable[[ReplicaEvent], None]:
    """Prints one line per replica death, return or abandonment and counts them; a
    generator replica that is back gets the newest weights; a buffer that died has the
    groups it held generated again."""

    def record(event: ReplicaEvent) -> None:
        faults = metrics.faults  # read now: a resume replaces it
        who = f"{event.service} replica {event.replica}"
        if event.kind == "died":
            faults.replica_deaths += 1
            if event.reason.startswith("hung:"):
                # Its processes are stopped right after the listeners: look first. Blocking
                # (about a second per process) is what keeps them there meanwhile.
                stuck = record_stuck(
                    Path(cfg.out_dir), f"{event.service}-{event.replica}", event.pids
                )
                log(stuck_line(who, event.reason.split("`")[1], _hung_for(event.reason), stuck))
            lost = ""
            if event.service == "buffer":
                groups = ledger.lose_buffer()
                faults.episodes_lost += groups * cfg.sampling.group_size
                if groups:
                    lost = f"; the {groups} groups it held are generated again"
                asyncio.get_running_loop().create_task(gate.notify())
            crashed = crash_note(read_crashes(cfg.out_dir, event.pids))
            log(f"[{who} died: {event.reason}{crashed}; restarting it{lost}]")
        elif event.kind == "up":
            faults.replica_restarts += 1
            faults.replica_down_s += event.down_s or 0.0
            log(f"[{who} is back after {event.down_s or 0.0:.1f}s (restart {event.restarts})]")
            if event.service == "generator":
                weights.resend()
        else:
            log(f"[{who} stays down after {event.restarts} restarts: {event.reason}]")

    return record


def episodes_lost_bound(cfg: RunConfig, *, buffer_deaths: int, trainer_deaths: int) -> int:
    """The most episodes `buffer_deaths` buffer and `trainer_deaths` trainer deaths can lose
    (counted in `episodes_lost`), given that every checkpoint is written.

    A buffer death loses what it held (at most `buffer.capacity`) and the puts on their way
    to it (one call per rollout loop). A trainer death loses every episode generated since
    the newest complete checkpoint: the batches of the steps since it (fewer than
    2 x `checkpoint.every`, since a checkpoint whose trainer part was not yet on disk when
    the trainer died is dropped and the next one waits for it), plus what the buffer held
    and the calls in flight. Episodes the buffer evicted as stale in that span count too;
    the bound assumes there are few (async mode throttles generation to
    `buffer.max_policy_age`).
    """
    in_flight = cfg.rollout_loops * cfg.generator.prompts_per_call * cfg.sampling.group_size
    held = cfg.buffer.capacity + in_flight
    since_checkpoint = (2 * cfg.checkpoint.every - 1) * cfg.trainer.batch_size
    return buffer_deaths * held + trainer_deaths * (since_checkpoint + held)


async def apply_cut(job: Job, cut: Cut, *, rollback: bool) -> None:
    """Puts the controller, the buffer and the generators at `cut` (the trainer already
    holds it): ledger, metrics (a rollback keeps the failure counters), task draws, the
    two JSONL files, the buffer's content, every generator on the cut's weights, the
    versions at the gate, and an evaluation the cut had running."""
    controller = cut.controller
    job.ledger.load(controller.ledger)
    job.metrics.restore(controller.metrics, keep_faults=rollback)
    if job.tasks is not None and controller.tasks is not None:
        job.tasks.load(controller.tasks)
    job.sink.rewind(cut.metrics_rows, cut.prompt_rows)
    if rollback or cut.buffer is not None:
        await job.components.buffer.endpoint(BufferActor.restore).route(cut.buffer)
    update = await job.components.trainer.publish_initial()
    job.weights.reset(update)
    synced = await sync_weights(job.components, update, exact=True)
    job.metrics.last_sync_transport = synced.transport
    job.metrics.last_pull_s = synced.seconds
    await job.gate.set(trainer=update.version, generators=update.version)
    if controller.pending_eval is not None:
        job.evaluator.request(controller.pending_eval)


async def restore_trainer(job: Job, reason: str) -> None:
    """The trainer died: a new one from the newest checkpoint, and the job back at that cut
    (one line now, one when it is back; counted, with the time it took)."""
    died_at = job.gate.trainer
    if job.metrics.faults.trainer_restores >= job.cfg.max_restarts:
        raise RuntimeError(
            f"the trainer died again ({reason}) after {job.cfg.max_restarts} restores"
        )
    await job.checkpoints.abandon()
    newest = job.checkpoints.newest
    source = newest.name if newest is not None else "the run's start"
    job.log(f"[trainer died: {reason}; restoring it from {source}]")
    start = time.perf_counter()
    job.evaluator.cancel()
    await job.components.trainer.stop()
    cut = job.base
    if newest is not None and newest != job.base.checkpoint:
        cut = await asyncio.to_thread(read_cut, newest, buffer_config(job.cfg))
    generated = job.metrics.episodes_generated
    job.components.trainer = await spawn_trainer(
        job.cfg,
        job.prep,
        job.components.procs,
        job.components.hosts,
        cut.trainer,
        log=job.log,
    )
    await apply_cut(job, cut, rollback=True)
    seconds = time.perf_counter() - start
    faults = job.metrics.faults
    faults.trainer_restores += 1
    faults.restore_s += seconds
    faults.steps_redone += max(0, died_at - cut.version)
    lost = max(0, generated - job.metrics.episodes_generated)
    faults.episodes_lost += lost
    # Those episodes were generated, and are lost: the count of generated ones keeps them
    # (every generated episode has one fate; their prompts are generated and counted again).
    job.metrics.fates.generated = generated
    redone = ""
    if died_at == cut.version + 1:
        redone = f"; step {died_at} is trained again"
    elif died_at > cut.version:
        redone = f"; steps {cut.version + 1}-{died_at} are trained again"
    job.log(
        f"[trainer is back at version {cut.version} after {seconds:.1f}s{redone}; the {lost} "
        "episodes generated since are generated again]"
    )


def _hung_for(reason: str) -> float:
    """The seconds in actor-service's "hung: no answer to `x` within N s, ..." reason."""
    words = reason.split(" within ", 1)[-1].split()
    try:
        return float(words[0])
    except (IndexError, ValueError):
        return 0.0
