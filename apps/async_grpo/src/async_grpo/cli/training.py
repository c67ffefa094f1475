"""The training command behind `async-grpo` (`cli/main.py` reads the options and imports
this only then): prepares the run (a resumed run's checkpoint read and checked first),
runs it watched for signals, and turns its end into one line and an exit status."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import traceback
from pathlib import Path

from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError
from monarch.actor import ActorError

from async_grpo.actors.crash_stacks import report_crashes
from async_grpo.checkpoint.resume import resume_hint
from async_grpo.config.schema import ConfigError, RunConfig
from async_grpo.controller.cut import Cut, read_cut
from async_grpo.controller.job import Spawn
from async_grpo.grpo.step import NonFiniteError
from async_grpo.launch.placement import describe, process_lost
from async_grpo.launch.prepare import Prepared, prepare
from async_grpo.launch.signals import run_watched
from async_grpo.launch.spawn import buffer_config, spawn_components
from async_grpo.observability.console import print_summary
from async_grpo.train import run


@dataclasses.dataclass(frozen=True)
class Start:
    """What a run starts from: `prep`, the prepared model, placement and devices; `resume`,
    the checkpoint's cut it continues (None: a fresh run)."""

    prep: Prepared
    resume: Cut | None


def prepare_start(cfg: RunConfig, checkpoint: Path | None) -> Start:
    """Reads the cut of `checkpoint` (a resumed run) and prepares the run, before any process
    starts. Raises `ValueError`, `OSError` or `RuntimeError` on bad input."""
    resume = read_cut(checkpoint, buffer_config(cfg)) if checkpoint is not None else None
    return Start(prepare(cfg), resume)


def train(cfg: RunConfig, start: Start, spawn: Spawn | None = None) -> int:
    """Runs `cfg` from `start`: exit status 0 on success, 1 when the run fails, 2 when it is
    refused as it starts, 128 + the signal when a signal stopped it."""
    prep, resume = start.prep, start.resume
    # A crash of the controller itself (a native library's abort, a segfault) prints every
    # thread's Python stack here before the process dies; its processes end with it.
    report_crashes()
    # A multi-turn run trains on its environments; `data.task` is then unused.
    task = f"env:{cfg.env.tasks}" if cfg.env.tasks else cfg.data.task
    print(
        f"async-grpo: mode={cfg.mode} model={prep.model_path} task={task} "
        f"steps={cfg.steps} batch={cfg.trainer.batch_size} group={cfg.sampling.group_size} "
        f"generators={cfg.generator.replicas} max_policy_age={cfg.effective_max_policy_age}"
    )
    if prep.placement.launcher != "local":
        print("\n".join(describe(prep.placement)))
    print("\n".join(prep.devices.describe()))
    try:
        # The run on a thread of its own, this one waiting for signals: a Ctrl-C or SIGTERM
        # stops it naming the process that sent it.
        summary = run_watched(run(cfg, prep, resume=resume, spawn=spawn or spawn_components))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print(
            f"\nasync-grpo: interrupted; every process was stopped; {resume_hint(cfg.out_dir)}.",
            file=sys.stderr,
        )
        return 130
    except ConfigError as e:  # refused as it started, before any process (W&B would not start)
        print(f"async-grpo: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # the run failed in a process, or the controller itself did
        if not isinstance(e, ActorError | NonFiniteError | SupervisionError):
            traceback.print_exc()  # a failure of the controller's own code: show where
        print(f"async-grpo: error: {run_failure(e)}; {resume_hint(cfg.out_dir)}", file=sys.stderr)
        return 1
    print_summary(summary, cfg.window, f"{cfg.out_dir}/metrics.jsonl")
    if summary.stopped_by is not None:
        print(
            f"async-grpo: interrupted; every process was stopped; {resume_hint(cfg.out_dir)}.",
            file=sys.stderr,
        )
        return 128 + summary.stopped_by
    if cfg.trace:
        print(f"trace: {cfg.out_dir}/trace.json (uv run async-grpo report {cfg.out_dir})")
    return 0


def run_failure(e: BaseException) -> str:
    """One line for a run that failed in a process: the innermost error, unwrapped from
    Monarch's `ActorError` (whose text is the whole remote traceback)."""
    where = " (in a spawned process)" if isinstance(e, ActorError) else ""
    while isinstance(e, ActorError):
        e = e.exception
    if isinstance(e, NonFiniteError):
        return str(e)
    if isinstance(e, SupervisionError):
        return process_lost(str(e))
    first = str(e).strip().splitlines()
    return f"{type(e).__name__}: {first[0] if first else ''}{where}"
