"""The controller's job from start to end: spawn every process, put them all at the starting
point (a fresh run, or the checkpoint `--resume` names), run the loops (`loop.py`) until
training ends, restore the trainer from the newest checkpoint whenever it dies
(`recovery.py`), and stop every process on return, error or Ctrl-C.

While it runs, `<out_dir>/processes.json` lists the pid of every process by component.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

from async_grpo import run_checkpoint
from async_grpo.actors.trainer import TrainResult
from async_grpo.broadcast import WeightBroadcast
from async_grpo.checkpointing import Checkpoints
from async_grpo.components import Components, process_table, shutdown, spawn_components
from async_grpo.config import RunConfig
from async_grpo.env_rollout import env_eval, generate_env_episodes, make_encode
from async_grpo.environments import TaskSource
from async_grpo.evaluation import Evaluator, prompt_eval
from async_grpo.faults import TrainerDied
from async_grpo.job import Run, StopRequest
from async_grpo.ledger import Call, PromptLedger
from async_grpo.loop import Rollout, cancel_tasks, generate_episode, run_phase
from async_grpo.metrics import RunMetrics, StepRow
from async_grpo.metrics_sink import MetricsSink
from async_grpo.model import load_tokenizer
from async_grpo.prepare import Prepared
from async_grpo.recovery import apply_cut, replica_event_recorder, restore_trainer
from async_grpo.resume import Cut
from async_grpo.run_state import ControllerState
from async_grpo.tasks import Sample, eval_set
from async_grpo.versions import Versions

StepCallback = Callable[[StepRow, TrainResult], None]
"""Called with each train step's row and result (the CLI's progress report)."""


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
) -> None:
    """Runs the whole job from its start or from `resume`, recording into `metrics`; every
    process started is stopped on return, error or Ctrl-C."""
    out_dir = Path(cfg.out_dir)
    run_checkpoint.remove_partials(out_dir)  # what a crash mid-write left behind
    sync_groups = cfg.trainer.batch_size // cfg.sampling.group_size
    ledger = PromptLedger(
        cfg.seed, cfg.generator.prompts_per_call, sync_groups if cfg.mode == "sync" else None
    )
    versions, weights = Versions(), WeightBroadcast()
    tasks = TaskSource(cfg.env, cfg.seed) if cfg.env.tasks else None
    recorder = replica_event_recorder(
        cfg, metrics=metrics, ledger=ledger, weights=weights, versions=versions, log=log
    )
    c = await spawn_components(cfg, prep, recorder, resume.trainer if resume else None)
    pids = asyncio.create_task(_keep_process_table(c, out_dir / PROCESSES_FILE))
    evaluator, rollout = _rollout_and_eval(
        c, cfg, prep, metrics=metrics, ledger=ledger, weights=weights, tasks=tasks, log=log
    )
    try:
        start = ControllerState(
            0, ledger.state({}), metrics.snapshot(), tasks.state() if tasks else None, None
        )
        base = resume or Cut(None, start, None, "", "")
        run = Run(
            cfg=cfg,
            prep=prep,
            c=c,
            ledger=ledger,
            versions=versions,
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
        await apply_cut(run, base, rollback=False)
        if resume is not None:
            metrics.faults.resumes += 1
            log(f"[resumed from {resume.checkpoint} at version {resume.version}]")
        elif cfg.eval_every:
            await evaluator.evaluate(0)  # the starting point later evaluations are read against

        def record(row: StepRow, result: TrainResult, groups: list[int]) -> None:
            sink.write(row, groups)
            on_step(row, result)

        draw = tasks.draw if tasks is not None else None
        # Train until done; a trainer that dies is restored from the newest checkpoint.
        while True:
            try:
                await run_phase(run, rollout, draw, record)
                break
            except TrainerDied as e:
                await restore_trainer(run, str(e))
    finally:
        await versions.stop()
        evaluator.cancel()
        await cancel_tasks([pids])
        await shutdown(c)


def _rollout_and_eval(
    c: Components,
    cfg: RunConfig,
    prep: Prepared,
    *,
    metrics: RunMetrics,
    ledger: PromptLedger,
    weights: WeightBroadcast,
    tasks: TaskSource | None,
    log: Callable[[str], None],
) -> tuple[Evaluator, Rollout]:
    """The run's rollout (prompts, or multi-turn episodes) and its evaluation."""
    if tasks is not None:
        # Whole episodes against the environment services, tasks drawn in the controller.
        encode = make_encode(load_tokenizer(prep.model_path))
        run_eval = env_eval(c, cfg, tasks, encode, log=log, newest=lambda: weights.newest)

        def env_rollout(call: Call) -> Awaitable[int]:
            return generate_env_episodes(
                c, cfg, metrics, ledger, call, encode=encode, weights=weights.newest
            )

        return Evaluator(run_eval, metrics), env_rollout
    prompts = eval_set_for(cfg, prep)
    run_eval = prompt_eval(c.generator, c.reward, prompts, cfg.seed, lambda: weights.newest)

    def prompt_rollout(call: Call) -> Awaitable[int]:
        return generate_episode(c, cfg, metrics, ledger, call, weights=weights.newest)

    return Evaluator(run_eval, metrics), prompt_rollout


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


def eval_set_for(cfg: RunConfig, prep: Prepared) -> list[Sample]:
    d = cfg.data
    return eval_set(d.task, d.min_n, d.max_n, prep.samples or (), size=cfg.eval_prompts)
