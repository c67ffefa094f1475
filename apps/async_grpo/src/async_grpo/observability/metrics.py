"""What a run measures and where it goes: a windowed reward, throughput, trainer idle time,
weight-sync time, failures and their recovery; one JSON line per step and, if `tensorboard`
is installed, TensorBoard. A checkpoint saves the counters (`MetricsState`), so a resumed
run's rows and summary continue the interrupted run's."""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from replay_buffer import Episode, columns_of

from async_grpo.generation.decoding import Completion
from async_grpo.generation.multiturn import PlayedEpisode, policy_text, policy_version, turn_ids
from async_grpo.observability.batch_stats import batch_diagnostics
from async_grpo.observability.fates import Fates
from async_grpo.tasks.rewards import exact_match

if TYPE_CHECKING:
    from async_grpo.actors.trainer import TrainResult


@dataclasses.dataclass(frozen=True)
class EvalScore:
    """The policy's mean reward on the fixed eval prompts (`tasks.prompts.eval_set`): `group_size`
    samples per prompt from the sampling distribution of weights `version`, each prompt
    weighted the same. Requested after train step `step`; `per_prompt` is in eval-set
    order. Unlike the training window, it does not depend on which prompts happened to be
    drawn lately."""

    step: int
    version: int
    reward: float
    exact: float
    per_prompt: tuple[tuple[str, float], ...]


@dataclasses.dataclass(frozen=True)
class StepRow:
    """One JSONL row, written after each train step; `version` is the step's number (the
    trainer's version counts its steps).

    Rates are per second of wall time since the first train step ended (start-up and the
    first fill of the buffer are excluded); `trainer_idle_frac` is the share of that time
    the trainer was not computing a step. Diagnostics of the trained batch:
    `uniform_groups` is the fraction of its groups in which every token's advantage is zero
    (they teach nothing; with episode credit, the groups whose rewards were all equal),
    `behavior_logprob` the mean log-prob per token the generators gave their own samples
    and `entropy` the trainer's policy entropy (nats per token) at those positions (both
    near 0: the policy has become deterministic and stopped exploring). `eval_reward` /
    `eval_version`: the latest finished evaluation (None before the first).
    `episodes_dropped`: multi-turn episodes never trained on because an episode of their
    group failed (an environment replica died, its code raised, or it timed out), those
    included. `checkpoint_s`: seconds this step's training was
    held to take a checkpoint (0 without one).

    Failures since the run began (a resumed run included; `Faults`): `replica_deaths` /
    `replica_restarts` of service replicas (generator, reward, environments, dataset,
    reference, buffer), `replica_down_s` the seconds the returned ones were down;
    `trainer_restores` from a checkpoint, `restore_s` their seconds, `steps_redone` the steps
    trained again after them; `episodes_lost` episodes generated and then lost to a failure
    (their prompts are generated again); `resumes` of the run with `--resume`."""

    version: int
    wall_s: float
    reward_window: float
    exact_window: float
    episodes_generated: int
    episodes_trained: int
    episodes_per_s: float
    tokens_per_s: float
    trainer_idle_frac: float
    weight_sync_s: float
    """Seconds from the broadcast offering the newest version until every generator replica
    runs it, as the controller times it: a replica busy sampling answers after its call, so
    on one replica this is mostly that wait (`weight_pull_s` is the pull itself)."""
    staleness_mean: float
    loss: float
    kl: float
    clip_frac: float
    grad_norm: float
    lr: float
    uniform_groups: float
    behavior_logprob: float
    entropy: float
    eval_reward: float | None
    eval_version: int | None
    episodes_dropped: int
    checkpoint_s: float
    replica_deaths: int
    replica_restarts: int
    replica_down_s: float
    trainer_restores: int
    restore_s: float
    steps_redone: int
    episodes_lost: int
    resumes: int
    weight_sync_transport: str = ""
    """How the last weight sync's bytes reached the generators: "shm" (same machine), "rdma"
    (another machine), or both joined by "+" (`weight_sync.WeightSync.transport`)."""
    weight_pull_s: float = 0.0
    """Seconds the slowest generator replica took to pull and install that version
    (`weight_sync.WeightSync.seconds`), whether a generation request or the broadcast
    brought it."""
    episodes_stale: int = 0
    """Where generated episodes went besides training (`fates.py`: generated = trained +
    stale + filtered + dropped + lost + held): evicted as older than `max_policy_age`..."""
    episodes_filtered: int = 0
    """... in a group whose rewards were all equal, dropped before the buffer ..."""
    episodes_held: int = 0
    """... and in the buffer, or taken for the next step, now."""
    stale_age_mean: float = 0.0
    """Versions behind the trainer the stale episodes were when evicted."""
    response_tokens_trained: float = 0.0
    """Mean response tokens of the trained episodes, and ..."""
    response_tokens_stale: float = 0.0
    """... of the stale ones: a staleness rule that starves long rollouts shows here."""
    weight_sync_bytes: int = 0
    """Bytes of tensor data one generator pulls for this step's version: the whole state
    dict, or with LoRA adapters the adapters alone."""


@dataclasses.dataclass
class Faults:
    """Failures and what they cost, counted since the run began (see `StepRow`); a trainer
    restored from a checkpoint rolls the run's other counters back, never these."""

    replica_deaths: int = 0
    replica_restarts: int = 0
    replica_down_s: float = 0.0
    trainer_restores: int = 0
    restore_s: float = 0.0
    steps_redone: int = 0
    episodes_lost: int = 0
    resumes: int = 0


@dataclasses.dataclass(frozen=True)
class Shown:
    """A scored response (or a multi-turn episode's policy turns, joined with " | ") kept
    for the progress report (never trained on from here)."""

    prompt: str
    response: str
    reward: float
    policy_version: int


class RunMetrics:
    """Counters shared by the rollout loops and the training loop (one event loop)."""

    def __init__(self, window: int) -> None:
        self.start = time.perf_counter()
        self.rewards: collections.deque[float] = collections.deque(maxlen=window)
        self.exact: collections.deque[float] = collections.deque(maxlen=window)
        self.recent: collections.deque[Shown] = collections.deque(maxlen=64)
        self.fates = Fates()
        self.tokens_generated = 0
        self.trained_at_first_step = 0
        self.trainer_busy_s = 0.0
        self.first_step_end: float | None = None
        self.tokens_at_first_step = 0
        self.last_sync_s = 0.0
        self.last_pull_s = 0.0
        self.last_sync_transport = ""
        self.episodes_dropped = 0
        self.evals: list[EvalScore] = []
        self.faults = Faults()
        self.start_reward: float | None = None  # the window's reward when it first was full
        self.reached_09: tuple[int, float] | None = None  # (step, wall s) it first was >= 0.9
        self.last_row: StepRow | None = None

    def record_episodes(
        self, completions: Sequence[Completion], targets: Sequence[str], rewards: Sequence[float]
    ) -> None:
        for comp, target, reward in zip(completions, targets, rewards, strict=True):
            self.rewards.append(reward)
            self.exact.append(exact_match(comp.text, target))
            self.recent.append(Shown(comp.prompt, comp.text, reward, comp.policy_version))
            self.tokens_generated += len(comp.response_ids)

    def record_played(self, groups: Sequence[Sequence[PlayedEpisode]]) -> None:
        """Counts a multi-turn play: the completed episodes' returns enter the window
        (`exact` is 1 for a full return)."""
        for record in (r for g in groups for r in g if r.ok):
            self.rewards.append(record.reward)
            self.exact.append(float(record.reward >= 1.0 - 1e-9))
            first = record.segments[0].text
            self.recent.append(
                Shown(first, policy_text(record), record.reward, policy_version(record))
            )
            self.tokens_generated += sum(
                len(turn_ids(s.payload)) for s in record.segments if s.payload
            )

    @property
    def episodes_generated(self) -> int:
        return self.fates.generated

    @property
    def episodes_trained(self) -> int:
        return self.fates.trained

    def examples(self, count: int) -> list[Shown]:
        """The newest scored responses, at most one per prompt, newest first."""
        seen: set[str] = set()
        out: list[Shown] = []
        for t in reversed(self.recent):
            if t.prompt not in seen:
                seen.add(t.prompt)
                out.append(t)
            if len(out) == count:
                break
        return out

    @property
    def last_eval(self) -> EvalScore | None:
        return self.evals[-1] if self.evals else None

    def window_full(self) -> bool:
        return len(self.rewards) == self.rewards.maxlen

    def reward_window(self) -> float:
        return sum(self.rewards) / max(1, len(self.rewards))

    def exact_window(self) -> float:
        return sum(self.exact) / max(1, len(self.exact))

    def record_step(self, episodes: Sequence[Episode], busy_s: float) -> None:
        now = time.perf_counter()
        self.fates.trained += len(episodes)
        self.fates.trained_tokens += int(columns_of(episodes).response_lens.sum())
        if self.first_step_end is None:
            self.first_step_end = now
            self.tokens_at_first_step = self.tokens_generated
            self.trained_at_first_step = self.fates.trained
            return
        self.trainer_busy_s += busy_s

    def rates(self) -> tuple[float, float, float]:
        """(trained episodes/s, generated tokens/s, trainer idle fraction) since step 1."""
        if self.first_step_end is None:
            return 0.0, 0.0, 1.0
        span = max(1e-9, time.perf_counter() - self.first_step_end)
        tokens = self.tokens_generated - self.tokens_at_first_step
        idle = 1.0 - min(1.0, self.trainer_busy_s / span)
        return (self.fates.trained - self.trained_at_first_step) / span, tokens / span, idle

    def step_row(
        self, result: TrainResult, episodes: Sequence[Episode], group_size: int, held: int = 0
    ) -> StepRow:
        """Records the step `result` trained on `episodes` and returns its row (`held`:
        episodes in the buffer, or on their way to the trainer, now)."""
        self.record_step(episodes, result.train_s + result.publish_s)
        eps, tps, idle = self.rates()
        # Versions behind the weights that trained on them (0 = on-policy).
        ages = result.version - 1 - columns_of(episodes).policy_version
        uniform, logprob = batch_diagnostics(episodes, group_size)
        last = self.last_eval
        wall = time.perf_counter() - self.start
        if self.window_full() and self.start_reward is None:
            self.start_reward = self.reward_window()
        if self.window_full() and self.reached_09 is None and self.reward_window() >= 0.9:
            self.reached_09 = (result.version, wall)
        self.last_row = StepRow(
            version=result.version,
            wall_s=wall,
            reward_window=self.reward_window(),
            exact_window=self.exact_window(),
            episodes_generated=self.episodes_generated,
            episodes_trained=self.episodes_trained,
            episodes_per_s=eps,
            tokens_per_s=tps,
            trainer_idle_frac=idle,
            weight_sync_s=self.last_sync_s,
            weight_pull_s=self.last_pull_s,
            staleness_mean=float(ages.double().mean()),
            loss=result.stats.loss,
            kl=result.stats.kl,
            clip_frac=result.stats.clip_frac,
            grad_norm=result.grad_norm,
            lr=result.lr,
            uniform_groups=uniform,
            behavior_logprob=logprob,
            entropy=result.stats.entropy,
            eval_reward=last.reward if last else None,
            eval_version=last.version if last else None,
            episodes_dropped=self.episodes_dropped,
            checkpoint_s=0.0,
            weight_sync_transport=self.last_sync_transport,
            weight_sync_bytes=result.update.nbytes,
            **dataclasses.asdict(self.faults),
            episodes_stale=self.fates.stale,
            episodes_filtered=self.fates.filtered,
            episodes_held=held,
            stale_age_mean=self.fates.stale_age_mean,
            response_tokens_trained=self.fates.trained_tokens_mean,
            response_tokens_stale=self.fates.stale_tokens_mean,
        )
        return self.last_row

    def held_for_checkpoint(self, seconds: float) -> StepRow:
        """The last row, with the seconds its step was held to take a checkpoint."""
        if self.last_row is None:
            raise ValueError("no step recorded yet")
        self.last_row = dataclasses.replace(self.last_row, checkpoint_s=seconds)
        return self.last_row

    def snapshot(self) -> MetricsState:
        """Everything a resumed run needs to continue these metrics as one run."""
        now = time.perf_counter()
        first = self.first_step_end
        return MetricsState(
            wall_s=now - self.start,
            rewards=tuple(self.rewards),
            exact=tuple(self.exact),
            recent=tuple(self.recent),
            episodes_generated=self.fates.generated,
            tokens_generated=self.tokens_generated,
            episodes_trained=self.fates.trained,
            trainer_busy_s=self.trainer_busy_s,
            first_step_end_s=None if first is None else first - self.start,
            tokens_at_first_step=self.tokens_at_first_step,
            last_sync_s=self.last_sync_s,
            last_pull_s=self.last_pull_s,
            episodes_dropped=self.episodes_dropped,
            evals=tuple(self.evals),
            faults=dataclasses.replace(self.faults),
            start_reward=self.start_reward,
            reached_09=self.reached_09,
            last_row=self.last_row,
            fates=dataclasses.replace(self.fates),
            trained_at_first_step=self.trained_at_first_step,
        )

    def restore(self, state: MetricsState, *, keep_faults: bool = False) -> None:
        """Continues from `state`, its clock included (wall time and rates go on from where it
        was taken). `keep_faults`: the failure counters stay as they are (a rollback within
        the run), instead of taking the saved ones (a resume)."""
        self.start = time.perf_counter() - state.wall_s
        self.rewards = collections.deque(state.rewards, maxlen=self.rewards.maxlen)
        self.exact = collections.deque(state.exact, maxlen=self.exact.maxlen)
        self.recent = collections.deque(state.recent, maxlen=self.recent.maxlen)
        self.fates = dataclasses.replace(
            state.fates, generated=state.episodes_generated, trained=state.episodes_trained
        )
        self.tokens_generated = state.tokens_generated
        self.trained_at_first_step = state.trained_at_first_step
        self.trainer_busy_s = state.trainer_busy_s
        first = state.first_step_end_s
        self.first_step_end = None if first is None else self.start + first
        self.tokens_at_first_step = state.tokens_at_first_step
        self.last_sync_s = state.last_sync_s
        self.last_pull_s = state.last_pull_s
        self.episodes_dropped = state.episodes_dropped
        self.evals = list(state.evals)
        if not keep_faults:
            self.faults = dataclasses.replace(state.faults)
        self.start_reward = state.start_reward
        self.reached_09 = state.reached_09
        self.last_row = state.last_row


@dataclasses.dataclass(frozen=True)
class MetricsState:
    """`RunMetrics` at a checkpoint's cut: the reward window and recent examples (newest
    last), counters, evaluations, failures, the first full window's reward and the first
    step >= 0.9 (step, wall s), the last row. Times are seconds since the run began."""

    wall_s: float
    rewards: tuple[float, ...]
    exact: tuple[float, ...]
    recent: tuple[Shown, ...]
    episodes_generated: int
    tokens_generated: int
    episodes_trained: int
    trainer_busy_s: float
    first_step_end_s: float | None
    tokens_at_first_step: int
    last_sync_s: float
    episodes_dropped: int
    evals: tuple[EvalScore, ...]
    faults: Faults
    start_reward: float | None
    reached_09: tuple[int, float] | None
    last_row: StepRow | None
    fates: Fates = dataclasses.field(default_factory=Fates)
    """Where episodes went (generated and trained are the two fields above)."""
    last_pull_s: float = 0.0
    """`StepRow.weight_pull_s` of the last row (0 in a checkpoint written before it)."""
    trained_at_first_step: int = 0
