"""The environment contract's data: tasks, actions, observations, step results, state.

The shape is the one OpenEnv and Gymnasium use: `reset(task) -> Observation`,
`step(Action) -> StepResult(observation, reward, done)`, `state() -> EnvState`. Everything
is text: the environment never sees tokens (the app tokenizes observations itself).
Every class checks its fields on construction and raises naming the bad one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from rl_envs._checks import check_int, check_name

Split = Literal["train", "eval"]
"""`train` tasks are drawn for training; `eval` tasks form each environment's fixed,
held-out evaluation set (no train task has the same content as an eval task)."""

Info = Mapping[str, str | int | float | bool]
"""Small JSON-ready extras for logs (scores, the sandbox's exit status, ...)."""


@dataclass(frozen=True)
class Task:
    """What to play: an episode's content is a pure function of this.

    Attributes:
        env: the environment's name (`"repeat"`, `"pattern"`, `"calculator"`, or the name
            an adapter was given); `reset` refuses a task for another environment.
        seed: fixes the episode's content (an int >= 0): the same task, the same episode.
        split: `"train"` or `"eval"` (see `Split`).
        level: difficulty, an int >= 0 (what it changes is the environment's; a
            `Curriculum` raises it).
    """

    env: str
    seed: int
    split: Split = "train"
    level: int = 0

    def __post_init__(self) -> None:
        check_name("Task.env", self.env)
        check_int("Task.seed", self.seed, 0)
        check_int("Task.level", self.level, 0)
        if self.split not in ("train", "eval"):
            raise ValueError(f"Task.split must be 'train' or 'eval', got {self.split!r}")


@dataclass(frozen=True)
class Action:
    """What the policy did this turn: the text it produced (for the calculator, a Python
    expression; for the word games, the word it says)."""

    text: str

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise TypeError(f"Action.text must be text (str), got {type(self.text).__name__}")


@dataclass(frozen=True)
class Observation:
    """What the environment says: `text` goes into the policy's context (the app tokenizes
    it; it is never trained on); `info` is for logs only and never shown to the policy."""

    text: str
    info: Info = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise TypeError(f"Observation.text must be text (str), got {type(self.text).__name__}")
        if not isinstance(self.info, Mapping):
            raise TypeError(f"Observation.info must be a mapping, got {type(self.info).__name__}")


@dataclass(frozen=True)
class StepResult:
    """The answer to one `step`.

    Attributes:
        observation: what the environment says next (after the last step, often empty).
        reward: the reward for this action, finite. The built-in environments give rewards
            in [0, 1] whose sum over an episode is in [0, 1] too.
        done: the episode is over; a further `step` raises `EpisodeDoneError`.
    """

    observation: Observation
    reward: float
    done: bool

    def __post_init__(self) -> None:
        if not isinstance(self.observation, Observation):
            raise TypeError(
                "StepResult.observation must be an Observation, got "
                f"{type(self.observation).__name__}"
            )
        if isinstance(self.reward, bool) or not isinstance(self.reward, int | float):
            raise TypeError(f"StepResult.reward must be a float, got {type(self.reward).__name__}")
        if not math.isfinite(self.reward):
            raise ValueError(f"StepResult.reward must be finite, got {self.reward}")
        object.__setattr__(self, "reward", float(self.reward))
        if not isinstance(self.done, bool):
            raise TypeError(f"StepResult.done must be a bool, got {type(self.done).__name__}")


@dataclass(frozen=True)
class EnvState:
    """Where an episode stands (for logs and checks; never shown to the policy).

    Attributes:
        task: the task of the current episode, None before the first `reset`.
        turns: `step` calls answered in this episode.
        done: the episode is over.
        total_reward: the sum of the rewards so far.
        info: environment-specific extras.
    """

    task: Task | None
    turns: int
    done: bool
    total_reward: float
    info: Info = field(default_factory=dict)
