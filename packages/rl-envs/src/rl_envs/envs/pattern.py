"""'Follow the pattern': the environment states rules "when I say X, you say Y", then says
cue words; the policy answers each with its rule's word."""

from __future__ import annotations

import random
from typing import ClassVar

from rl_envs._checks import check_number
from rl_envs.environment import GeneratedEnvironment
from rl_envs.envs._words import WORDS
from rl_envs.types import Action, Info, Observation, StepResult, Task

Rules = tuple[tuple[str, str], ...]
"""(cue, answer) pairs, in the order they are stated."""


class FollowThePattern(GeneratedEnvironment[tuple[Rules, tuple[str, ...]]]):
    """A multi-turn rule-following game.

    The first observation states every rule ("When I say apple, you say river.") and, on
    its own line, the first cue; each later observation is the next cue alone. The answer
    is right when it is the cue's word (surrounding whitespace ignored). Each right answer
    earns `1 / cues`; an answer that is another rule's word (the rules were read, the cue
    was not) earns `near_miss / cues`. An episode's rewards add up to at most 1 (all
    right), in [0, 1]. The last step's observation is empty.

    `near_miss` (in [0, 1)) credits a policy that has learned to answer with the rules'
    words before it can tell which. Default 0, the strict game: with near-miss credit a
    wrong rule word outscores every other wrong answer (docs/07_environments.md says why
    that was dropped; no run measured it alone).

    Level `L` (0 to 4) states `L + 2` rules over distinct words of `words`, then asks every
    cue once in shuffled order and one of them again (`L + 3` cues).

    `words` is 16 nouns. The skill is the same over any number, but a randomly initialised
    model needs more tasks to find the lookup over more: trained supervised, 32 tasks a
    step for 400 steps, the tiny model scores 0.76 with 16 words and 0.44 with 48
    (docs/07_environments.md). A subclass with its own `name` and `words` plays another
    pool; the pool must be distinct words, enough for `max_level`'s rules (refused at class
    definition otherwise).
    """

    name = "pattern"
    max_level: ClassVar[int] = 4
    words: ClassVar[tuple[str, ...]] = WORDS[:16]

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        words, need = cls.words, 2 * (cls.max_level + 2)
        if len(set(words)) != len(words) or not all(w.split() == [w] for w in words):
            raise ValueError(f"{cls.__name__}.words must be distinct single words: {words!r}")
        if len(words) < need:
            raise ValueError(
                f"{cls.__name__}.words has {len(words)} words; max_level {cls.max_level} "
                f"states {need // 2} rules, which need {need} (lower max_level or add words)"
            )

    def __init__(self, near_miss: float = 0.0) -> None:
        super().__init__()
        self.near_miss = check_number("FollowThePattern near_miss", near_miss, 0.0, 1.0)
        if self.near_miss >= 1.0:
            raise ValueError("FollowThePattern near_miss must be < 1 (a right answer earns 1)")
        self._rules: dict[str, str] = {}
        self._answers: set[str] = set()
        self._cues: tuple[str, ...] = ()
        self._turn = 0
        self._correct = 0

    @classmethod
    def generate(cls, rng: random.Random, level: int) -> tuple[Rules, tuple[str, ...]]:
        n = level + 2
        words = rng.sample(cls.words, 2 * n)
        rules = tuple(zip(words[:n], words[n:], strict=True))
        cues = [cue for cue, _ in rules]
        rng.shuffle(cues)
        cues.append(rng.choice(cues))
        return rules, tuple(cues)

    @classmethod
    def statement(cls, rules: Rules) -> str:
        return " ".join(f"When I say {cue}, you say {answer}." for cue, answer in rules)

    @classmethod
    def corpus(cls) -> list[str]:
        """Every text this environment can say, and every right answer."""
        # The pool stated as rules, two words each (an odd last word is listed after).
        pairs = tuple(zip(cls.words[::2], cls.words[1::2], strict=False))
        return [cls.statement(pairs), *cls.words]

    async def _reset(self, task: Task) -> Observation:
        rules, self._cues = self.content(task)
        self._rules, self._turn, self._correct = dict(rules), 0, 0
        self._answers = {answer for _, answer in rules}
        return Observation(f"{self.statement(rules)}\n{self._cues[0]}")

    async def _step(self, action: Action) -> StepResult:
        expected = self._rules[self._cues[self._turn]]
        answer = action.text.strip()
        right = answer == expected
        credit = 1.0 if right else self.near_miss if answer in self._answers else 0.0
        self._turn += 1
        self._correct += right
        done = self._turn == len(self._cues)
        text = "" if done else self._cues[self._turn]
        return StepResult(
            Observation(text, {"right": right, "expected": expected}),
            reward=credit / len(self._cues),
            done=done,
        )

    async def _info(self) -> Info:
        return {"right": self._correct, "cues": len(self._cues)}
