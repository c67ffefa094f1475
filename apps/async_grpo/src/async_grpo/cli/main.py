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

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from async_grpo.checkpoint.resume import check_fresh_start, resume_config, split_resume
from async_grpo.config.args import build_config
from async_grpo.config.validate import validate

if TYPE_CHECKING:
    from async_grpo.controller.job import Spawn


# Each subcommand's module is imported when it runs: a training run never imports plotly,
# and `--help` none of them.
def _report(argv: list[str]) -> int:
    from async_grpo.observability.report.build import main as report  # noqa: PLC0415

    return report(argv)


def _sweep(argv: list[str]) -> int:
    from async_grpo.cli.sweep import main as sweep  # noqa: PLC0415

    return sweep(argv)


def _export(argv: list[str]) -> int:
    from async_grpo.cli.export import main as export  # noqa: PLC0415

    return export(argv)


def _eval(argv: list[str]) -> int:
    from async_grpo.cli.evaluate import main as evaluate  # noqa: PLC0415

    return evaluate(argv)


SUBCOMMANDS: dict[str, Callable[[list[str]], int]] = {
    "report": _report,
    "sweep": _sweep,
    "export": _export,
    "eval": _eval,
}
"""`async-grpo NAME ARGS...` runs `SUBCOMMANDS[NAME](ARGS)` instead of a training run; the
first argument is looked up here before any config parsing."""


def main(argv: list[str] | None = None, *, spawn: Spawn | None = None) -> int:
    """The `async-grpo` command: exit status 0 on success, 2 on bad input (one line on stderr,
    no process spawned), 1 when the run fails (one line), 130 when interrupted. `spawn`
    starts the run's processes (`train.run`; None: `launch.spawn.spawn_components`)."""
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in SUBCOMMANDS:
        return SUBCOMMANDS[args[0]](args[1:])
    try:
        target, args = split_resume(args)
        cfg = build_config(args, __doc__ or "")
        if target is not None:
            cfg, path = resume_config(target, args, __doc__ or "")
            validate(cfg)
        else:
            path = None
            check_fresh_start(Path(cfg.out_dir))
        # Imported once the options are read: `--help` and a mistyped option answer in a
        # fraction of a second instead of after the seconds torch and transformers take.
        from async_grpo.cli import training  # noqa: PLC0415

        start = training.prepare_start(cfg, path)  # all checked before anything is written
    except SystemExit as e:  # --help, printed by tyro
        return e.code if isinstance(e.code, int) else 0
    except (ValueError, OSError, RuntimeError) as e:
        print(f"async-grpo: error: {e}", file=sys.stderr)
        return 2
    return training.train(cfg, start, spawn)


if __name__ == "__main__":
    raise SystemExit(main())
