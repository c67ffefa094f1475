"""`uv run async-grpo`: asynchronous GRPO on a Qwen2-architecture model.

Spawns a dataset, a generator service, a reward service, a replay buffer, a trainer (and a
reference model when the KL term is on), each in its own process, on this host or on the
host meshes `--placement` names (`launch/placement.py`), and trains until `--steps` train steps or
`--max_minutes`. Prints sampled trajectories and throughput every `--log_every` steps,
writes `<out_dir>/metrics.jsonl`, and ends with a summary.

    uv run async-grpo                                # default preset, async
    uv run async-grpo --mode sync --steps 100        # the same loop, max_policy_age=0
    uv run async-grpo --trainer.lr 1e-4 --trainer.loss.kl_coef 0.05
    uv run async-grpo --preset qwen2.5-0.5b --model /path/to/Qwen2.5-0.5B-Instruct
    uv run async-grpo --help                         # every option, its meaning and default
    uv run async-grpo --resume                       # continue the newest checkpoint of --out_dir
    uv run async-grpo report runs/async-grpo         # report.html from a run's metrics and trace
    uv run async-grpo sweep                          # max_policy_age 0, 1, 2, 4, one report
    uv run async-grpo export runs/async-grpo OUT     # the newest checkpoint as a HF model dir
    uv run async-grpo eval runs/async-grpo           # pass@1, pass@k, mean reward of a model
    uv run async-grpo --placement.launcher process --placement.hosts a=1,b=1,c=1
        --placement.components 'trainer=a,generator=b,*=c'   # (one line) three local hosts

`--preset NAME` picks the named preset (`presets.PRESETS`), whose values are the defaults
every other option overrides; `--model PATH` is short for `--model.path PATH`. `--resume
[PATH]` continues a checkpoint (the newest of `--out_dir`, or PATH) with its config, the
other options applied on top. An unknown key, a value of the wrong type or out of range, a
checkpoint that is missing, damaged or of another config is a one-line error before any
process starts. Ctrl-C or SIGTERM ends the run after its current step with a checkpoint.
"""

from __future__ import annotations

import asyncio
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError
from monarch.actor import ActorError

from async_grpo.checkpoint.resume import (
    check_fresh_start,
    resume_config,
    resume_hint,
    split_resume,
)
from async_grpo.cli import evaluate, export, sweep
from async_grpo.config.args import build_config
from async_grpo.config.schema import ConfigError
from async_grpo.config.validate import validate
from async_grpo.controller.cut import Cut, read_cut
from async_grpo.controller.job import Spawn
from async_grpo.grpo.step import NonFiniteError
from async_grpo.launch.placement import describe, process_lost
from async_grpo.launch.prepare import prepare
from async_grpo.launch.signals import run_watched
from async_grpo.launch.spawn import buffer_config, spawn_components
from async_grpo.observability.console import print_summary
from async_grpo.train import run


def _report(argv: list[str]) -> int:
    # Imported when called: a training run never imports plotly.
    from async_grpo.observability.report.build import main as report  # noqa: PLC0415

    return report(argv)


SUBCOMMANDS: dict[str, Callable[[list[str]], int]] = {
    "report": _report,
    "sweep": sweep.main,
    "export": export.main,
    "eval": evaluate.main,
}
"""`async-grpo NAME ARGS...` runs `SUBCOMMANDS[NAME](ARGS)` instead of a training run; the
first argument is looked up here before any config parsing."""


def main(argv: list[str] | None = None, *, spawn: Spawn = spawn_components) -> int:
    """The `async-grpo` command: exit status 0 on success, 2 on bad input (one line on stderr,
    no process spawned), 1 when the run fails (one line), 130 when interrupted. `spawn`
    starts the run's processes (`train.run`)."""
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in SUBCOMMANDS:
        return SUBCOMMANDS[args[0]](args[1:])
    resume: Cut | None = None
    try:
        target, args = split_resume(args)
        cfg = build_config(args, __doc__ or "")
        if target is not None:
            cfg, path = resume_config(target, args, __doc__ or "")
            validate(cfg)
            resume = read_cut(path, buffer_config(cfg))  # all checked before anything is written
        else:
            check_fresh_start(Path(cfg.out_dir))
        prep = prepare(cfg)
    except SystemExit as e:  # --help, printed by tyro
        return e.code if isinstance(e.code, int) else 0
    except (ValueError, OSError, RuntimeError) as e:
        print(f"async-grpo: error: {e}", file=sys.stderr)
        return 2
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
        summary = run_watched(run(cfg, prep, resume=resume, spawn=spawn))
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


if __name__ == "__main__":
    raise SystemExit(main())


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
