"""Which environments a run trains on, and which tasks it plays: `--env.tasks` parsed,
checked and turned into a `TaskSource` (a task mixture with a curriculum per environment).

Pure, no Monarch: the controller draws the tasks itself (drawing is cheap), and `prepare`
checks the spec before any process is spawned.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from rl_envs import Curriculum, LevelChange, Task, TaskMixture, UnknownEnvironmentError
from rl_envs.registry import names, resolve
from rl_envs.sandbox import Sandbox, SandboxUnavailableError

from async_grpo.config.schema import EnvConfig

SANDBOXED = frozenset({"calculator"})
"""Built-in environments that run the model's output in the bubblewrap sandbox."""


def parse_env_weights(spec: str) -> dict[str, float]:
    """ "pattern" -> {"pattern": 1.0}; "repeat:1,pattern:2" -> {"repeat": 1.0, "pattern": 2.0}.

    Every name must be a registered environment (`rl_envs.names()`); weights are finite,
    >= 0, with at least one > 0. A `ValueError` names the problem."""
    weights: dict[str, float] = {}
    for part in spec.split(","):
        name, _, raw = part.strip().partition(":")
        if not name:
            raise ValueError(f"{spec!r}: an empty environment name")
        if name in weights:
            raise ValueError(f"{spec!r}: environment {name!r} is named twice")
        try:
            weight = float(raw) if raw else 1.0
        except ValueError:
            raise ValueError(f"{spec!r}: bad weight {raw!r} for {name!r}") from None
        if not (math.isfinite(weight) and weight >= 0):
            raise ValueError(f"{spec!r}: the weight of {name!r} must be finite and >= 0")
        try:
            resolve(name)
        except UnknownEnvironmentError:
            raise ValueError(f"unknown environment {name!r}; known: {', '.join(names())}") from None
        weights[name] = weight
    if sum(weights.values()) <= 0:
        raise ValueError(f"{spec!r}: at least one weight must be > 0")
    return weights


def max_level(name: str) -> int:
    """The highest level of environment `name` (0 for one without levels)."""
    return int(getattr(resolve(name), "max_level", 0))


def held_out_size(name: str) -> int | None:
    """How many held-out evaluation tasks environment `name` keeps per level (its
    `eval_size`); None for one that declares no held-out set (its evaluation tasks are
    then only told apart from training tasks by their split)."""
    size = getattr(resolve(name), "eval_size", None)
    return int(size) if isinstance(size, int) else None


def check_env_config(cfg: EnvConfig, eval_prompts: int) -> dict[str, float]:
    """The parsed `tasks` of an env config, after checking what the run will need: each
    level in range, `eval_prompts` within each held-out set (more would evaluate on tasks
    training may have drawn), and bubblewrap for a sandboxed environment. A `ValueError`
    names the problem (the caller turns it into a config error)."""
    try:
        weights = parse_env_weights(cfg.tasks)
    except ValueError as e:
        raise ValueError(f"env.tasks: {e}") from None
    for name in weights:
        if cfg.level > max_level(name):
            raise ValueError(
                f"env.level {cfg.level} is above the top level of {name!r} ({max_level(name)})"
            )
        size = held_out_size(name)
        if size is not None and eval_prompts > size:
            raise ValueError(
                f"eval_prompts ({eval_prompts}) is more than the {size} held-out tasks of "
                f"{name!r}: the others could have been trained on"
            )
        if name in SANDBOXED:
            try:
                Sandbox()  # one real probe run
            except SandboxUnavailableError as e:
                raise ValueError(
                    f"environment {name!r} runs programs in the sandbox: {e}"
                ) from None
    return weights


def env_corpus(weights: dict[str, float]) -> list[str]:
    """Every text the environments say (for training a word-level tokenizer on them)."""
    texts: list[str] = []
    for name in weights:
        corpus = getattr(resolve(name), "corpus", None)
        if corpus is None:
            raise ValueError(
                f"environment {name!r} has no corpus() to build a tokenizer from; give a "
                "checkpoint with its own tokenizer (--model.path)"
            )
        texts += list(corpus())
    return texts


@dataclasses.dataclass(frozen=True)
class TaskSourceState:
    """A `TaskSource` at a checkpoint: its mixture's random state (`random.getstate()`), the
    draws per environment, and each environment's curriculum level."""

    rng: tuple[int, tuple[int, ...], float | None]
    drawn: tuple[tuple[str, int], ...]
    levels: tuple[tuple[str, int], ...]


class TaskSource:
    """The tasks a run plays: groups drawn from a `TaskMixture`, each environment at its
    own curriculum level; evaluation on each environment's held-out tasks at that level.

    Deterministic given `seed`."""

    def __init__(self, cfg: EnvConfig, seed: int) -> None:
        self.weights = parse_env_weights(cfg.tasks)
        self.mixture = TaskMixture(self.weights, seed=seed)
        self.curricula = {
            # Without `--env.curriculum` the threshold is never consulted (`report` returns).
            name: Curriculum(max_level(name), threshold=cfg.curriculum or 1.0, start=cfg.level)
            for name in self.weights
        }
        self.adaptive = cfg.curriculum > 0

    @property
    def levels(self) -> dict[str, int]:
        return {name: c.level for name, c in self.curricula.items()}

    def state(self) -> TaskSourceState:
        mixture = self.mixture.state_dict()
        rng = mixture["rng"]
        drawn = mixture["drawn"]
        assert isinstance(rng, tuple)
        assert isinstance(drawn, dict)
        return TaskSourceState(rng, tuple(drawn.items()), tuple(self.levels.items()))

    def load(self, state: TaskSourceState) -> None:
        """Continues the draws and levels of `state` (a curriculum's history of promotions
        is not kept: only the level it reached)."""
        self.mixture.load_state_dict({"rng": state.rng, "drawn": dict(state.drawn)})
        for name, level in state.levels:
            self.curricula[name].level = level

    def draw(self, count: int) -> list[Task]:
        """`count` training tasks (each one GRPO group's)."""
        return [self.mixture.sample(self.levels) for _ in range(count)]

    def eval_tasks(self, per_env: int) -> list[Task]:
        """The first `per_env` held-out tasks of every environment with weight > 0, at its
        current level (the same tasks each time while the level stays)."""
        tasks: list[Task] = []
        for name, weight in self.weights.items():
            if weight == 0:
                continue
            level = self.curricula[name].level
            held_out = getattr(resolve(name), "eval_tasks", None)  # GeneratedEnvironment's
            if held_out is not None:
                tasks += list(held_out(level))[:per_env]
            else:
                tasks += [Task(name, seed, "eval", level) for seed in range(per_env)]
        return tasks

    def report(self, scores: dict[str, float]) -> list[tuple[str, LevelChange]]:
        """Feeds each environment's evaluation score to its curriculum (when adaptive);
        returns the promotions."""
        if not self.adaptive:
            return []
        changes: list[tuple[str, LevelChange]] = []
        for name, score in scores.items():
            curriculum = self.curricula[name]
            if curriculum.report(min(1.0, max(0.0, score))):
                changes.append((name, curriculum.history[-1]))
        return changes


def mean_by_env(tasks: Sequence[Task], returns: Sequence[float]) -> dict[str, float]:
    """Mean return per environment of tasks played once each, in the same order."""
    sums: dict[str, list[float]] = {}
    for task, value in zip(tasks, returns, strict=True):
        sums.setdefault(task.env, []).append(value)
    return {name: sum(v) / len(v) for name, v in sums.items()}
