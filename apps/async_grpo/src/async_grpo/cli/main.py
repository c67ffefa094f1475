"""`uv run async-grpo`: asynchronous GRPO on a Qwen2-architecture model.

Spawns a dataset, a generator service, a reward service, a replay buffer, a trainer (and a
reference model when the KL term is on), each in its own process, on this host or on the
host meshes `--placement` names (`placement.py`), and trains until `--steps` train steps or
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
import dataclasses
import importlib
import json
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError
from monarch.actor import ActorError
from tqdm import tqdm  # type: ignore[import-untyped]

from async_grpo import tracing
from async_grpo.actors.trainer import TrainResult
from async_grpo.arguments import parse, take_flag
from async_grpo.components import buffer_config
from async_grpo.config import ConfigError, RunConfig, validate
from async_grpo.controller import run_job
from async_grpo.job import StopRequest
from async_grpo.metrics import RunMetrics, StepRow
from async_grpo.metrics_sink import MetricsSink
from async_grpo.placement import describe, process_lost
from async_grpo.prepare import Prepared, prepare
from async_grpo.presets import PRESETS, default_preset
from async_grpo.resume import (
    Cut,
    check_compatible,
    check_fresh_start,
    check_newest,
    find_checkpoint,
    read_cut,
    resume_hint,
    saved_config,
    split_resume,
    start_fresh,
)
from async_grpo.training import NonFiniteError


def _lazy(module: str) -> Callable[[list[str]], int]:
    """The `main(argv)` of `async_grpo.<module>`, imported only when called (plotly is not
    imported by a training run)."""

    def call(argv: list[str]) -> int:
        code: int = importlib.import_module(f"async_grpo.{module}").main(argv)
        return code

    return call


SUBCOMMANDS: dict[str, Callable[[list[str]], int]] = {
    "report": _lazy("report"),
    "sweep": _lazy("sweep"),
}
"""`async-grpo NAME ARGS...` runs `SUBCOMMANDS[NAME](ARGS)` instead of a training run; the
first argument is looked up here before any config parsing."""


@dataclasses.dataclass(frozen=True)
class Summary:
    """The end of a run: the windowed reward at the first full window and at the end, the
    first step whose window reached 0.9 (None if never), the evaluations (the last one is
    of the final weights; None when evaluation is off), and throughput."""

    mode: str
    steps: int
    wall_s: float
    reward_start: float
    reward_end: float
    exact_end: float
    reached_09_step: int | None
    reached_09_s: float | None
    eval_start: float | None
    eval_end: float | None
    eval_per_prompt: tuple[tuple[str, float], ...]
    eval_reached_09_step: int | None
    episodes_per_s: float
    trainer_idle_frac: float
    stopped_by: int | None = None
    """The signal (SIGINT, SIGTERM) that ended the run early, None if it ran to its end."""


def split_preset(argv: list[str]) -> tuple[str, list[str]]:
    """Takes `--preset NAME` (or `--preset=NAME`) out of `argv`: (preset, the rest)."""
    preset, rest = take_flag(argv, "--preset")
    if preset is None:
        return default_preset(), rest
    if preset not in PRESETS:
        raise ConfigError(f"--preset: unknown preset {preset!r}; known: {sorted(PRESETS)}")
    return preset, rest


def resume_config(target: str, argv: list[str]) -> tuple[RunConfig, Path]:
    """The config of a resumed run and its checkpoint: the checkpoint's config with `argv`
    applied on top (with `--preset`: the preset's, as without `--resume`), checked against
    the checkpoint's (`resume.MAY_CHANGE`)."""
    given = build_config(argv)
    path = find_checkpoint(target, Path(given.out_dir))
    saved = saved_config(path)
    with_preset = any(a == "--preset" or a.startswith("--preset=") for a in argv)
    cfg = given if with_preset else parse(argv, saved)
    check_compatible(path, saved, cfg)
    check_newest(path, Path(cfg.out_dir))
    return cfg, path


def build_config(argv: list[str]) -> RunConfig:
    """The `RunConfig` of a command line: the preset's, with every `--section.field value`
    applied. Raises `ConfigError` on bad input; `--help` prints the help and raises
    `SystemExit(0)`."""
    preset, rest = split_preset(argv)
    presets = ", ".join(f"{name} (default here)" if name == preset else name for name in PRESETS)
    description = f"{__doc__}\nPresets: {presets}. The defaults below are {preset}'s."
    return parse(rest, PRESETS[preset](), description=description)


class Reporter:
    """Progress bar, periodic report lines with sample trajectories, and the summary."""

    def __init__(self, cfg: RunConfig, metrics: RunMetrics, quiet: bool) -> None:
        self.cfg, self.metrics, self.quiet = cfg, metrics, quiet
        self.bar = tqdm(
            total=cfg.steps,
            desc=f"{cfg.mode} GRPO",
            unit="step",
            leave=False,
            disable=True if quiet else None,
        )
        self.shown_eval: int | None = None

    def on_step(self, row: StepRow, result: TrainResult) -> None:
        del result
        self.bar.update(1)
        self.bar.set_postfix(reward=f"{row.reward_window:.2f}", v=row.version)
        if not self.quiet and (row.version % self.cfg.log_every == 0 or row.version == 1):
            self.report(row)

    def report(self, row: StepRow) -> None:
        w = tqdm.write
        ev = self.metrics.last_eval
        evals = f"eval(v{ev.version}) {ev.reward:.3f}" if ev else "eval -"
        w(
            f"step {row.version:4d} | reward({self.cfg.window}) "
            f"{row.reward_window:.3f} exact {row.exact_window:.2f} | {evals} | "
            f"{row.episodes_per_s:.0f} ep/s {row.tokens_per_s:.0f} tok/s | "
            f"trainer idle {row.trainer_idle_frac:.0%} | sync {row.weight_sync_s * 1e3:.0f} ms | "
            f"stale {row.staleness_mean:.2f} | loss {row.loss:+.3f} | "
            f"uniform groups {row.uniform_groups:.0%} | entropy {row.entropy:.2f} | "
            f"{row.wall_s:.0f}s"
        )
        if ev is not None and ev.version != self.shown_eval:
            self.shown_eval = ev.version
            w(f"    eval per prompt: {per_prompt(ev.per_prompt)}")
        for shown in self.metrics.examples(3):
            w(
                f"    {shown.prompt!r} -> {shown.response!r}  reward {shown.reward:.2f} "
                f"(generator v{shown.policy_version}, {row.version - shown.policy_version} behind)"
            )

    def summary(self, stopped_by: int | None) -> Summary:
        """The run's summary; a resumed run's continues the interrupted run's (its metrics,
        wall clock included, were restored from the checkpoint)."""
        metrics = self.metrics
        evals = metrics.evals
        self.bar.close()
        last, reached, start = metrics.last_row, metrics.reached_09, metrics.start_reward
        return Summary(
            mode=self.cfg.mode,
            steps=last.version if last else 0,
            wall_s=time.perf_counter() - metrics.start,
            reward_start=start if start is not None else float("nan"),
            reward_end=metrics.reward_window(),
            exact_end=sum(metrics.exact) / max(1, len(metrics.exact)),
            reached_09_step=reached[0] if reached else None,
            reached_09_s=reached[1] if reached else None,
            eval_start=evals[0].reward if evals else None,
            eval_end=evals[-1].reward if evals else None,
            eval_per_prompt=evals[-1].per_prompt if evals else (),
            eval_reached_09_step=next((e.step for e in evals if e.reward >= 0.9), None),
            episodes_per_s=last.episodes_per_s if last else 0.0,
            trainer_idle_frac=last.trainer_idle_frac if last else 1.0,
            stopped_by=stopped_by,
        )


async def run(
    cfg: RunConfig, prep: Prepared, quiet: bool = False, resume: Cut | None = None
) -> Summary:
    """Trains with `cfg` (from `resume` when given) and returns the summary (also what the
    tests and benchmarks call). Writes `<out_dir>/config.json`, and with `cfg.trace` every
    process's spans into `<out_dir>/trace.json` (also when the run fails or is
    interrupted). Without `resume`, `resume.start_fresh` clears `out_dir` first: the
    checkpoints of a finished run there are deleted, those of a run that did not finish are
    refused (`ConfigError`, nothing written). The first Ctrl-C or SIGTERM ends the run after
    its current step, with a checkpoint; a second Ctrl-C stops at once."""
    out_dir = Path(cfg.out_dir)
    # Before anything is written there: a run that did not finish is refused, a finished
    # one's checkpoints go.
    if resume is None and (replaced := start_fresh(out_dir)):
        n = len(replaced)
        tqdm.write(f"[a new run in {out_dir}: the finished run's checkpoints removed ({n})]")
    sink = MetricsSink(out_dir)
    (out_dir / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), default=str))
    metrics = RunMetrics(cfg.window)
    reporter = Reporter(cfg, metrics, quiet)
    stop = StopRequest()
    restore = _stop_on_signals(stop, reporter.quiet)
    try:
        with tracing.session(out_dir, enabled=cfg.trace):
            await run_job(
                cfg, prep, sink, reporter.on_step, metrics, log=tqdm.write, resume=resume, stop=stop
            )
    finally:
        restore()
        sink.close()
    return reporter.summary(stop.signal)


def _stop_on_signals(stop: StopRequest, quiet: bool) -> Callable[[], None]:
    """SIGINT / SIGTERM ask the run to stop after its step (a second SIGINT cancels it
    outright); returns what puts the previous handling back."""
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    signals = (signal.SIGINT, signal.SIGTERM)

    def on_signal(signum: int) -> None:
        if stop.signal is not None:
            if main is not None:
                main.cancel()  # the second one: stop at once, without a checkpoint
            return
        stop.request(signum)
        if not quiet:
            tqdm.write(
                f"[{signal.Signals(signum).name}: ending after this step with a checkpoint; "
                "Ctrl-C again to stop at once]"
            )

    try:
        for sig in signals:
            loop.add_signal_handler(sig, on_signal, sig)
    except (NotImplementedError, RuntimeError):  # not the main thread: no signals here
        return lambda: None

    def restore() -> None:
        for sig in signals:
            loop.remove_signal_handler(sig)

    return restore


def per_prompt(scores: tuple[tuple[str, float], ...]) -> str:
    return "  ".join(f"{prompt.removesuffix(':')[-24:]} {r:.2f}" for prompt, r in scores)


def print_summary(s: Summary, window: int, metrics_path: str) -> None:
    reached = (
        f"step {s.reached_09_step} ({s.reached_09_s:.0f}s)" if s.reached_09_step else "not reached"
    )
    evals = ""
    if s.eval_end is not None:
        first = f"step {s.eval_reached_09_step}" if s.eval_reached_09_step else "not reached"
        evals = (
            f"eval (every prompt of the eval set): initial weights {s.eval_start:.3f} -> final "
            f"{s.eval_end:.3f}; >= 0.9 first at {first}\n"
            f"    final eval per prompt: {per_prompt(s.eval_per_prompt)}\n"
        )
    print(
        f"\n== summary ({s.mode}) ==\n"
        f"reward ({window}-episode window): start {s.reward_start:.3f} -> end {s.reward_end:.3f} "
        f"(exact match {s.exact_end:.2f})\n"
        f"reward >= 0.9: {reached}\n"
        f"{evals}"
        f"steps {s.steps}, wall {s.wall_s:.0f}s, {s.episodes_per_s:.0f} trained episodes/s, "
        f"trainer idle {s.trainer_idle_frac:.0%}\n"
        f"metrics: {metrics_path}"
    )


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


def main(argv: list[str] | None = None) -> int:
    """The `async-grpo` command: exit status 0 on success, 2 on bad input (one line on stderr,
    no process spawned), 1 when the run fails (one line), 130 when interrupted."""
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in SUBCOMMANDS:
        return SUBCOMMANDS[args[0]](args[1:])
    resume: Cut | None = None
    try:
        target, args = split_resume(args)
        cfg = build_config(args)
        if target is not None:
            cfg, path = resume_config(target, args)
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
    try:
        summary = asyncio.run(run(cfg, prep, resume=resume))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print(
            f"\nasync-grpo: interrupted; every process was stopped; {resume_hint(cfg.out_dir)}.",
            file=sys.stderr,
        )
        return 130
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
