"""`Environment`: the contract every environment implements (OpenEnv / Gymnasium shape).

    env = RepeatAfterMe()
    obs = await env.reset(Task("repeat", seed=3))
    result = await env.step(Action("banana"))       # StepResult(observation, reward, done)
    state = await env.state()                       # EnvState(task, turns, done, ...)

The methods are async so that an environment may wait on I/O (a sandboxed program, an
OpenEnv server) without blocking the replica that serves it. One instance plays one episode
at a time; `reset` starts the next. The base class owns the bookkeeping and the checks
(wrong task, wrong action type, step before reset or after done), all raised before the
subclass sees the call, so a rejected call changes nothing.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Hashable
from typing import ClassVar, Generic, TypeVar

from rl_envs.errors import ActionTypeError, EpisodeDoneError, EpisodeNotStartedError
from rl_envs.types import Action, EnvState, Info, Observation, StepResult, Task

C = TypeVar("C", bound=Hashable)


class Environment(ABC):
    """One episode at a time of one kind of task. Subclasses implement `_reset` and
    `_step` (and `_info`, `close` if they hold more)."""

    name: str = ""
    """The name tasks use (`Task.env`) and the registry knows it by."""

    def __init__(self) -> None:
        self._task: Task | None = None
        self._turns = 0
        self._done = False
        self._total = 0.0

    async def reset(self, task: Task) -> Observation:
        """Starts the episode `task` describes (abandoning any current one) and returns the
        first observation."""
        if not isinstance(task, Task):
            raise TypeError(f"{self.name}.reset expects a rl_envs.Task, got {type(task).__name__}")
        if task.env != self.name:
            raise ValueError(f"a task for environment {task.env!r} was given to {self.name!r}")
        observation = await self._reset(task)
        if not isinstance(observation, Observation):
            raise TypeError(f"{type(self).__name__}._reset must return an Observation")
        self._task, self._turns, self._done, self._total = task, 0, False, 0.0
        return observation

    async def step(self, action: Action) -> StepResult:
        """Applies `action` and returns the observation, the reward for it and `done`."""
        if not isinstance(action, Action):
            raise ActionTypeError(
                f"{self.name}.step expects a rl_envs.Action, got {type(action).__name__}"
            )
        if self._task is None:
            raise EpisodeNotStartedError(f"{self.name}: step before reset")
        if self._done:
            raise EpisodeDoneError(
                f"{self.name}: step after done (the episode of {self._task} ended after "
                f"{self._turns} turns); reset() starts a new one"
            )
        result = await self._step(action)
        if not isinstance(result, StepResult):
            raise TypeError(f"{type(self).__name__}._step must return a StepResult")
        self._turns += 1
        self._total += result.reward
        self._done = result.done
        return result

    async def state(self) -> EnvState:
        """Where the current episode stands."""
        return EnvState(self._task, self._turns, self._done, self._total, await self._info())

    async def close(self) -> None:
        """Releases what the environment holds (connections, processes); the default holds
        nothing."""
        return None

    @abstractmethod
    async def _reset(self, task: Task) -> Observation:
        """Builds the episode of `task` (checked: a Task for this environment)."""

    @abstractmethod
    async def _step(self, action: Action) -> StepResult:
        """One turn (checked: an Action, inside a running episode)."""

    async def _info(self) -> Info:
        return {}


class GeneratedEnvironment(Environment, Generic[C]):
    """An environment whose episode content is generated from the task's seed.

    The content of `Task(name, seed, split, level)` is `generate(rng, level)` with `rng`
    seeded by all four fields (a string seed: stable across processes and Python runs).
    The evaluation set of a level is the `eval_size` tasks with split `"eval"` and seeds
    `0 .. eval_size - 1`; a train task whose content equals one of theirs draws again, so
    evaluation content is never trained on.
    """

    eval_size: ClassVar[int] = 64
    max_level: ClassVar[int] = 0
    _held_out_cache: ClassVar[dict[tuple[type, int], frozenset[Hashable]]] = {}

    @classmethod
    @abstractmethod
    def generate(cls, rng: random.Random, level: int) -> C:
        """One episode's content at `level` (hashable, so held-out content is a set)."""

    @classmethod
    def content(cls, task: Task) -> C:
        """The content of `task` (deterministic); a `ValueError` for a level above
        `max_level`."""
        if task.level > cls.max_level:
            raise ValueError(f"{cls.name}: level {task.level} is above max_level {cls.max_level}")
        rng = random.Random(f"{cls.name}:{task.split}:{task.level}:{task.seed}")
        content = cls.generate(rng, task.level)
        if task.split == "train":
            held_out = cls.held_out(task.level)
            for _ in range(1000):
                if content not in held_out:
                    break
                content = cls.generate(rng, task.level)
            else:
                raise RuntimeError(f"{cls.name}: level {task.level} is almost all held out")
        return content

    @classmethod
    def held_out(cls, level: int) -> frozenset[Hashable]:
        """The content of the evaluation set at `level`."""
        key = (cls, level)
        if key not in cls._held_out_cache:
            tasks = cls.eval_tasks(level)
            cls._held_out_cache[key] = frozenset(cls.content(t) for t in tasks)
        return cls._held_out_cache[key]

    @classmethod
    def eval_tasks(cls, level: int = 0) -> list[Task]:
        """The fixed evaluation set at `level`: `eval_size` tasks."""
        return [Task(cls.name, seed, "eval", level) for seed in range(cls.eval_size)]
