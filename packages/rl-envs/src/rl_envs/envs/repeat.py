"""'Repeat after me': the environment says a word, the policy says it back, turn after turn."""

from __future__ import annotations

import random
from typing import ClassVar

from rl_envs.environment import GeneratedEnvironment
from rl_envs.envs._words import WORDS
from rl_envs.types import Action, Info, Observation, StepResult, Task


class RepeatAfterMe(GeneratedEnvironment[tuple[str, ...]]):
    """A multi-turn copying game.

    The first observation is the instruction and the first word; each later observation is
    the next word alone. The policy's answer is right when it is that word (surrounding
    whitespace ignored, case kept). Each right answer earns `1 / words`, so an episode's
    rewards add up to the fraction repeated right, in [0, 1]. The last step's observation
    is empty.

    Level `L` (0 to 6) plays `L + 2` words drawn with replacement from 48.
    """

    name = "repeat"
    max_level: ClassVar[int] = 6
    INTRO: ClassVar[str] = "Repeat after me, one word at a time."

    def __init__(self) -> None:
        super().__init__()
        self._words: tuple[str, ...] = ()
        self._turn = 0
        self._correct = 0

    @classmethod
    def generate(cls, rng: random.Random, level: int) -> tuple[str, ...]:
        return tuple(rng.choice(WORDS) for _ in range(level + 2))

    @classmethod
    def corpus(cls) -> list[str]:
        """Every text this environment can say, and every right answer (for building a
        tokenizer that knows them all)."""
        return [cls.INTRO, *WORDS]

    async def _reset(self, task: Task) -> Observation:
        self._words, self._turn, self._correct = self.content(task), 0, 0
        return Observation(f"{self.INTRO} {self._words[0]}")

    async def _step(self, action: Action) -> StepResult:
        expected = self._words[self._turn]
        right = action.text.strip() == expected
        self._turn += 1
        self._correct += right
        done = self._turn == len(self._words)
        text = "" if done else self._words[self._turn]
        return StepResult(
            Observation(text, {"right": right, "expected": expected}),
            reward=right / len(self._words),
            done=done,
        )

    async def _info(self) -> Info:
        return {"right": self._correct, "words": len(self._words)}
