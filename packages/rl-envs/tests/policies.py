"""Scripted policies for the tests: each reads only the conversation's text, as a model
would, and answers right (or wrong, on the turns it is told to)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from rl_envs.episode import PolicyTurn, Segment

Payload = tuple[int, ...]
"""What these policies return as payload: fake token ids, one per character."""


def last_env_text(conversation: Sequence[Segment[Payload]]) -> str:
    return next(s.text for s in reversed(conversation) if s.source == "environment")


def turn_number(conversation: Sequence[Segment[Payload]]) -> int:
    return sum(s.source == "policy" for s in conversation)


class Oracle:
    """Solves repeat, pattern and calculator from the text; `wrong_on` lists turns (0-based)
    to answer wrong on purpose."""

    def __init__(self, wrong_on: Sequence[int] = ()) -> None:
        self.wrong_on = set(wrong_on)
        self.calls = 0

    async def __call__(self, conversation: Sequence[Segment[Payload]]) -> PolicyTurn[Payload]:
        self.calls += 1
        text = self.answer(conversation)
        if turn_number(conversation) in self.wrong_on:
            text = "wrong"
        return PolicyTurn(text, tuple(ord(c) for c in text))

    @staticmethod
    def answer(conversation: Sequence[Segment[Payload]]) -> str:
        first = conversation[0].text
        cue = last_env_text(conversation).splitlines()[-1].split()[-1]
        if first.startswith("Repeat after me"):
            return cue
        if first.startswith("When I say"):
            rules = dict(re.findall(r"When I say (\w+), you say (\w+)\.", first))
            answer: str = rules[cue]
            return answer
        if first.startswith("Compute "):
            return translate(first)
        raise AssertionError(f"unknown task: {first!r}")


def translate(question: str) -> str:
    """The calculator's question ("Compute 7 times 4 with Python.") as an expression."""
    words = re.fullmatch(r"Compute (.+) with Python\.", question).group(1)  # type: ignore[union-attr]
    symbols = {"plus": "+", "minus": "-", "times": "*"}
    return " ".join(symbols.get(word, word) for word in words.split())
