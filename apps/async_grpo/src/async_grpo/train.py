"""`run(cfg)`: one training run from Python, as the command line, the sweep, the tests and the
benchmarks start it.

    from async_grpo.config.presets import tiny
    from async_grpo.train import run

    summary = asyncio.run(run(tiny(), quiet=True))
    print(summary.reward_end, summary.metrics.evals[-1].reward)

It checks and prepares the config (`launch.prepare`) unless given what was prepared, clears
or refuses the output directory, starts the run's W&B run with `cfg.metrics.wandb`, writes
`<out_dir>/config.json`, records every process's spans with `cfg.trace`, runs the job
(`controller.job.run_job`) and returns its summary.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from tqdm import tqdm  # type: ignore[import-untyped]

from async_grpo import tracing
from async_grpo.actors.cores import release_heap, settle_heap
from async_grpo.actors.trainer import TrainResult
from async_grpo.checkpoint.resume import start_fresh
from async_grpo.config.schema import RunConfig
from async_grpo.controller.context import StopRequest
from async_grpo.controller.cut import Cut
from async_grpo.controller.job import Spawn, StepCallback, run_job
from async_grpo.launch import signals
from async_grpo.launch.prepare import Prepared, prepare
from async_grpo.launch.spawn import spawn_components
from async_grpo.observability.console import Reporter, Summary, stop_signal
from async_grpo.observability.crashes import crash_dir, remove_empty
from async_grpo.observability.metrics import RunMetrics, StepRow
from async_grpo.observability.sink import MetricsSink
from async_grpo.observability.wandb_run import WandbRun


async def run(
    cfg: RunConfig,
    prep: Prepared | None = None,
    *,
    resume: Cut | None = None,
    quiet: bool = False,
    on_step: StepCallback | None = None,
    log: Callable[[str], None] = tqdm.write,
    spawn: Spawn = spawn_components,
) -> Summary:
    """Trains with `cfg` (from `resume` when given) and returns the summary, the run's
    metrics with it. `prep`: what `launch.prepare.prepare(cfg)` returned (prepared here when
    None). `quiet`: no progress bar or report lines; `log` still gets the one-line events (a
    replica died, a checkpoint was written). `on_step` is called after every train step;
    `spawn` starts the processes (a test's keeps their handles).

    Without `resume`, `checkpoint.resume.start_fresh` clears `out_dir` first: the
    checkpoints of a finished run there are deleted, those of a run that did not finish are
    refused (`ConfigError`, nothing written). The first Ctrl-C or SIGTERM ends the run after
    its current step, with a checkpoint (`log` gets a line naming the signal and, when the
    run was started with `launch.signals.run_watched` as the `async-grpo` command starts
    it, the process that sent it; so does the summary); a second Ctrl-C stops at once."""
    prep = prep if prep is not None else prepare(cfg)
    out_dir = Path(cfg.out_dir)
    # Before anything is written there: a run that did not finish is refused, a finished
    # one's checkpoints go.
    if resume is None and (replaced := start_fresh(out_dir)):
        log(f"[a new run in {out_dir}: the finished run's checkpoints removed ({len(replaced)})]")
    if resume is None:  # the stacks of a run this one does not go on from
        shutil.rmtree(crash_dir(out_dir), ignore_errors=True)
    wandb = WandbRun(cfg, out_dir, resume=resume is not None) if cfg.metrics.wandb else None
    sink = MetricsSink(out_dir, wandb)
    (out_dir / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), default=str))
    metrics = RunMetrics(cfg.window)
    reporter = Reporter(cfg, metrics, quiet)

    settled = False

    def step_done(row: StepRow, result: TrainResult) -> None:
        nonlocal settled
        if not settled:  # set up, what a step uses imported: the heap so far stays
            settle_heap()
            settled = True
        reporter.on_step(row, result)
        if on_step is not None:
            on_step(row, result)

    stop = StopRequest()
    restore = _stop_on_signals(stop, log)
    failed = True
    try:
        with tracing.session(out_dir, enabled=cfg.trace), _one_torch_thread():
            await run_job(
                cfg, prep, sink, step_done, metrics, log=log, resume=resume, stop=stop, spawn=spawn
            )
        failed = False
    finally:
        restore()
        release_heap()
        remove_empty(out_dir)  # what is left: the stacks of processes that crashed
        # After the trace is merged: a W&B run's report is written from it.
        sink.close(failed=failed)
    return reporter.summary(stop.signal, stop.sender)


@contextlib.contextmanager
def _one_torch_thread() -> Iterator[None]:
    """The controller's own tensor work is small (a call's advantages, episodes packed and
    unpacked), and the cores belong to the generators and the trainer, which each run one
    torch thread. With more, every small op in the controller hands work to OpenMP threads
    that wait for a core those processes hold: on 2 cores in a default run, py-spy found
    39% of the controller's samples in `group_advantages` (about 8 ms a call by the sample
    count; 0.03 ms with one thread, timed) and the controller used 57% of a core (32% with
    one). The setting is the thread's, put back when the run ends."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _stop_on_signals(stop: StopRequest, log: Callable[[str], None]) -> Callable[[], None]:
    """SIGINT / SIGTERM ask the run to stop after its step (a second one cancels it
    outright); returns what puts the previous handling back.

    Under `launch.signals.run_watched` the signals arrive through the watch, with their
    senders; otherwise (a run on the main thread's loop) through Python's handlers,
    sender unknown."""
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()

    def on_signal(signum: int, sender: signals.Sender | None = None) -> None:
        if stop.signal is not None:
            if main is not None:
                main.cancel()  # the second one: stop at once, without a checkpoint
            return
        stop.request(signum, str(sender) if sender is not None else None)
        log(
            f"[{stop_signal(signum, stop.sender)}: ending after this step with a checkpoint; "
            "Ctrl-C again to stop at once]"
        )

    unlisten = signals.listen(loop, on_signal) if signals.watching() else None
    handled: list[int] = []
    if unlisten is None:
        try:
            for sig in signals.STOP_SIGNALS:
                loop.add_signal_handler(sig, on_signal, sig)
                handled.append(sig)
        except (NotImplementedError, RuntimeError):  # not the main thread: no signals here
            pass

    def restore() -> None:
        if unlisten is not None:
            unlisten()
        for sig in handled:
            loop.remove_signal_handler(sig)

    return restore
