"""What a run prints: the progress bar and report lines, the summary, a failure in one line."""

from __future__ import annotations

import dataclasses
import signal
import time

from tqdm import tqdm  # type: ignore[import-untyped]

from async_grpo.actors.trainer import TrainResult
from async_grpo.config.schema import RunConfig
from async_grpo.observability.metrics import RunMetrics, StepRow


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
    metrics: RunMetrics = dataclasses.field(repr=False, compare=False)
    """Everything the run measured (its evaluations, rewards, failures)."""
    stopped_by: int | None = None
    """The signal (SIGINT, SIGTERM) that ended the run early, None if it ran to its end."""
    stopped_by_sender: str | None = None
    """Who sent `stopped_by`: "pid 1234 (its command line)" (None: not known)."""


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
            f"trained {_share(row.episodes_trained, row.episodes_generated)} of generated | "
            f"trainer idle {row.trainer_idle_frac:.0%} | sync {row.weight_sync_s * 1e3:.0f} ms "
            f"(pull {row.weight_pull_s * 1e3:.0f} ms) | "
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

    def summary(self, stopped_by: int | None, sender: str | None = None) -> Summary:
        """The run's summary; a resumed run's continues the interrupted run's (its metrics,
        wall clock included, were restored from the checkpoint). `stopped_by`: the signal
        that ended it early, `sender` who sent it."""
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
            stopped_by_sender=sender,
            metrics=metrics,
        )


def stop_signal(signum: int, sender: str | None) -> str:
    """A stop signal and who sent it: "SIGTERM from pid 1234 (its command line)"."""
    try:
        name = signal.Signals(signum).name
    except ValueError:  # a number that names no signal: said as it is, never a crash
        name = f"signal {signum}"
    return f"{name} from {sender}" if sender else f"{name} (sender unknown)"


def per_prompt(scores: tuple[tuple[str, float], ...]) -> str:
    return "  ".join(f"{prompt.removesuffix(':')[-24:]} {r:.2f}" for prompt, r in scores)


def print_summary(s: Summary, window: int, metrics_path: str) -> None:
    reached = (
        f"step {s.reached_09_step} ({s.reached_09_s:.0f}s)"
        if s.reached_09_step is not None
        else "not reached"
    )
    evals = ""
    if s.eval_end is not None:
        # Step 0 is a real answer: the initial weights already scored >= 0.9.
        first = (
            f"first at step {s.eval_reached_09_step}"
            if s.eval_reached_09_step is not None
            else "not reached"
        )
        evals = (
            f"eval (every prompt of the eval set): initial weights {s.eval_start:.3f} -> final "
            f"{s.eval_end:.3f}; >= 0.9 {first}\n"
            f"    final eval per prompt: {per_prompt(s.eval_per_prompt)}\n"
        )
    stopped = ""
    if s.stopped_by is not None:
        stopped = f"stopped early by {stop_signal(s.stopped_by, s.stopped_by_sender)}\n"
    print(
        f"\n== summary ({s.mode}) ==\n"
        f"reward ({window}-episode window): start {s.reward_start:.3f} -> end {s.reward_end:.3f} "
        f"(exact match {s.exact_end:.2f})\n"
        f"reward >= 0.9: {reached}\n"
        f"{evals}"
        f"steps {s.steps}, wall {s.wall_s:.0f}s, {s.episodes_per_s:.0f} trained episodes/s, "
        f"trainer idle {s.trainer_idle_frac:.0%}\n"
        f"{stopped}"
        f"metrics: {metrics_path}"
    )


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "-"
