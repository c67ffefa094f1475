"""Environments the service tests serve. Pickled by value: the replica processes cannot
import this directory, so cloudpickle ships the classes themselves."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import cloudpickle  # type: ignore[import-untyped]
from monarch.actor import Actor, endpoint
from rl_envs import (
    Action,
    Environment,
    EnvironmentService,
    Observation,
    PolicyTurn,
    Segment,
    StepResult,
    Task,
    run_episode,
)

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Crashy(Environment):
    """Three turns; every observation says which process serves it. The action "crash"
    kills that process in the middle of the step; "raise" makes the environment's own code
    fail."""

    name = "crashy"

    def __init__(self, turns: int = 3) -> None:
        super().__init__()
        self.turns = turns
        self._turn = 0

    async def _reset(self, task: Task) -> Observation:
        self._turn = 0
        return Observation(f"pid {os.getpid()}")

    async def _step(self, action: Action) -> StepResult:
        if action.text == "crash":
            os._exit(9)
        if action.text == "raise":
            raise RuntimeError("the environment's own bug")
        self._turn += 1
        return StepResult(
            Observation(f"pid {os.getpid()}"), reward=1 / self.turns, done=self._turn == self.turns
        )


class Player(Actor):
    """Plays episodes from inside another actor, through an `EnvironmentService` handle."""

    @endpoint
    async def play(self, env: EnvironmentService, seed: int) -> tuple[bool, float]:
        async def parrot(conversation: Sequence[Segment[None]]) -> PolicyTurn[None]:
            return PolicyTurn(conversation[-1].text.split()[-1], None)

        record = await run_episode(parrot, env, Task(env.name, seed=seed))
        return record.ok, record.reward
