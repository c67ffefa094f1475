"""A small OpenEnv environment server, built with openenv-core's own server classes, that
the interop tests start as a separate process:

    python openenv_server.py --port 8123

"Echo words": `reset(seed)` picks three words from the seed; each observation's `prompt`
says "say <word>"; an action whose `message` is that word earns 1/3; three steps end it.
"""

from __future__ import annotations

import argparse
import random
from typing import Any

import uvicorn
from openenv.core.env_server.http_server import create_app  # type: ignore[import-untyped]
from openenv.core.env_server.interfaces import Environment  # type: ignore[import-untyped]
from openenv.core.env_server.types import (  # type: ignore[import-untyped]
    Action,
    Observation,
    State,
)
from pydantic import Field

WORDS = ["amber", "birch", "cedar", "delta", "ember", "fjord", "glade", "heron"]
TURNS = 3


class EchoAction(Action):  # type: ignore[misc]
    message: str = Field(..., description="the word said")


class EchoObservation(Observation):  # type: ignore[misc]
    prompt: str = Field(default="", description="what the environment says")
    turn: int = Field(default=0)


class EchoWords(Environment[EchoAction, EchoObservation, State]):  # type: ignore[misc]
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._words: list[str] = []
        self._state = State(episode_id=None, step_count=0)

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> EchoObservation:
        self._words = random.Random(seed).sample(WORDS, TURNS)
        self._state = State(episode_id=episode_id, step_count=0)
        return EchoObservation(prompt=f"say {self._words[0]}", done=False, reward=0.0)

    def step(
        self, action: EchoAction, timeout_s: float | None = None, **kwargs: Any
    ) -> EchoObservation:
        turn = self._state.step_count
        reward = 1 / TURNS if action.message == self._words[turn] else 0.0
        self._state.step_count = turn + 1
        done = self._state.step_count == TURNS
        prompt = "" if done else f"say {self._words[turn + 1]}"
        return EchoObservation(prompt=prompt, turn=turn + 1, done=done, reward=reward)

    @property
    def state(self) -> State:
        return self._state


app = create_app(EchoWords, EchoAction, EchoObservation, env_name="echo", max_concurrent_envs=16)

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    uvicorn.run(app, host="127.0.0.1", port=parser.parse_args().port, log_level="warning")
