"""The controller's job from start to end: spawn every process, put them all at the starting
point (a fresh run, or the checkpoint `--resume` names), run the loops (`loops.py`) until
training ends, restore the trainer from the newest checkpoint whenever it dies
(`controller/recovery.py`), and stop every process on return, error or Ctrl-C.

While it runs, `<out_dir>/processes.json` lists the pid of every process by component.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from actor_service import ReplicaEvent

from async_grpo.actors.trainer import TrainResult
from async_grpo.checkpoint import disk
from async_grpo.config.schema import RunConfig
from async_grpo.controller.broadcast import WeightBroadcast
from async_grpo.controller.checkpoints import Checkpoints
from async_grpo.controller.context import Job, StopRequest
from async_grpo.controller.cut import ControllerState, Cut
from async_grpo.controller.evaluation import make_evaluator
from async_grpo.controller.ledger import PromptLedger
from async_grpo.controller.loops import cancel_tasks, run_loops
from async_grpo.controller.recovery import apply_cut, replica_event_recorder, restore_trainer
from async_grpo.controller.rollout import make_rollout
from async_grpo.controller.staleness import StalenessGate
from async_grpo.launch.prepare import Prepared
from async_grpo.launch.spawn import Components, process_table, shutdown, spawn_components
from async_grpo.launch.trainer import TrainerDied
from async_grpo.observability.metrics import RunMetrics, StepRow
from async_grpo.observability.sink import MetricsSink
from async_grpo.tasks.environments import TaskSource

StepCallback = Callable[[StepRow, TrainResult], None]
"""Called with each train step's row and result (the CLI's progress report)."""


class Spawn(Protocol):
    """Starts every process of a job (`launch.spawn.spawn_components`): the config, what was
    prepared, the listener of replica events, the trainer checkpoint to start from, and
    where one-line events go."""

    def __call__(
        self,
        cfg: RunConfig,
        prep: Prepared,
        on_replica_event: Callable[[ReplicaEvent], None],
        restore: Path | None = None,
        *,
        log: Callable[[str], None] = print,
    ) -> Awaitable[Components]: ...


async def run_job(
    cfg: RunConfig,
    prep: Prepared,
    sink: MetricsSink,
    on_step: StepCallback,
    metrics: RunMetrics,
    *,
    log: Callable[[str], None] = print,
    resume: Cut | None = None,
    stop: StopRequest | None = None,
    spawn: Spawn = spawn_components,
) -> None:
    """Runs the whole job from its start or from `resume`, recording into `metrics`; every
    process started is stopped on return, error or Ctrl-C. `spawn` starts the processes (a
    test passes one that keeps the handles, to kill a replica or read a pid)."""
    out_dir = Path(cfg.out_dir)
    disk.remove_partials(out_dir)  # what a crash mid-write left behind
    sync_groups = cfg.trainer.batch_size // cfg.sampling.group_size
    ledger = PromptLedger(
        cfg.seed, cfg.generator.prompts_per_call, sync_groups if cfg.mode == "sync" else None
    )
    gate = StalenessGate(cfg.effective_max_policy_age, batch_groups=sync_groups)
    weights = WeightBroadcast()
    tasks = TaskSource(cfg.env, cfg.seed) if cfg.env.tasks else None
    recorder = replica_event_recorder(
        cfg, metrics=metrics, ledger=ledger, weights=weights, gate=gate, log=log
    )
    c = await spawn(cfg, prep, recorder, resume.trainer if resume else None, log=log)
    pids = asyncio.create_task(_keep_process_table(c, out_dir / PROCESSES_FILE))
    evaluator = make_evaluator(c, cfg, prep, metrics, tasks, log=log, newest=lambda: weights.newest)
    try:
        start = ControllerState(
            0, ledger.state({}), metrics.snapshot(), tasks.state() if tasks else None, None
        )
        base = resume or Cut(None, start, None, "", "")
        job = Job(
            cfg=cfg,
            prep=prep,
            components=c,
            ledger=ledger,
            gate=gate,
            metrics=metrics,
            weights=weights,
            sink=sink,
            checkpoints=Checkpoints(cfg, base.checkpoint, log),
            evaluator=evaluator,
            tasks=tasks,
            base=base,
            stop=stop or StopRequest(),
            log=log,
        )
        # Every process at the starting point: the trainer's version (0, or the
        # checkpoint's), its weights on every generator, the buffer, ledger and metrics.
        await apply_cut(job, base, rollback=False)
        if resume is not None:
            metrics.faults.resumes += 1
            log(f"[resumed from {resume.checkpoint} at version {resume.version}]")
        elif cfg.eval_every:
            await evaluator.evaluate(0)  # the starting point later evaluations are read against

        def record(row: StepRow, result: TrainResult, groups: list[int]) -> None:
            sink.write(row, groups)
            on_step(row, result)

        rollout = make_rollout(job)
        # Train until done; a trainer that dies is restored from the newest checkpoint.
        while True:
            try:
                await run_loops(job, rollout, record)
                break
            except TrainerDied as e:
                await restore_trainer(job, str(e))
    finally:
        await gate.stop()
        evaluator.cancel()
        await cancel_tasks([pids])
        began = time.perf_counter()
        await shutdown(c)
        if (took := time.perf_counter() - began) > SLOW_SHUTDOWN_S:
            log(f"[stopping the run's processes took {took:.1f} s]")


SLOW_SHUTDOWN_S = 5.0
"""A shutdown slower than this is logged with its time."""

PROCESSES_FILE = "processes.json"
"""`<out_dir>/processes.json`: the pid of every process of the run by component, kept
current while it runs (what `benchmarks/chaos.py` kills)."""


async def _keep_process_table(c: Components, path: Path) -> None:
    """Rewrites `path` whenever a process of the run changed (checked every second)."""
    written = None
    while True:
        table = process_table(c)
        if table != written:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(table))
            tmp.replace(path)
            written = table
        await asyncio.sleep(1.0)
