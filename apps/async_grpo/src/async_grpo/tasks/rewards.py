"""Reward functions: `(response, target) -> float` in [0, 1], pure.

The headline reward of the `count` task is `count_score`: the fraction of positions that hold
the right number, divided by the longer of the two sequences, so it is 1.0 exactly when the
response is the target and every missing, wrong or extra number costs the same. It reads only
the response and the target: no hint of the answer reaches the model except through reward.
`math` (`math_reward.math_score`) checks a final answer as mathematics with math-verify.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

from async_grpo.tasks.math_reward import math_score

RewardFn = Callable[[str, str], float]

_NUMBER = re.compile(r"-?\d+")


def count_score(response: str, target: str) -> float:
    """Per-position credit: matches / max(len(response), len(target)) over words."""
    got, want = response.split(), target.split()
    if not want:
        return float(not got)
    hits = sum(g == w for g, w in zip(got, want, strict=False))
    return hits / max(len(got), len(want))


def exact_match(response: str, target: str) -> float:
    """1.0 when the response equals the target up to surrounding whitespace."""
    return float(response.strip() == target.strip())


def numeric_answer(response: str, target: str) -> float:
    """1.0 when the last integer in the response equals the target's integer."""
    numbers = _NUMBER.findall(response)
    return float(bool(numbers) and numbers[-1] == target.strip())


def number_format(response: str, target: str) -> float:
    """1.0 when the response is a single integer and nothing else (format, not correctness)."""
    del target
    return float(_NUMBER.fullmatch(response.strip()) is not None)


REWARDS: dict[str, RewardFn] = {
    "count": count_score,
    "exact": exact_match,
    "numeric": numeric_answer,
    "format": number_format,
    "math": math_score,
}


def combined(weights: dict[str, float], table: Mapping[str, RewardFn] = REWARDS) -> RewardFn:
    """The weighted sum of named rewards, normalised by the total weight; `table` maps the
    names to their functions (the reward actor puts `math` in a process of its own)."""
    unknown = sorted(set(weights) - set(table))
    if unknown:
        raise ValueError(f"unknown reward function(s) {unknown}; known: {sorted(table)}")
    total = sum(weights.values())
    if total <= 0:
        raise ValueError("reward weights must sum to a positive number")
    fns = [(table[name], w / total) for name, w in weights.items()]

    def score(response: str, target: str) -> float:
        return sum(w * fn(response, target) for fn, w in fns)

    return score


def parse_weights(spec: str) -> dict[str, float]:
    """ "count" -> {"count": 1.0}; "numeric:0.9,format:0.1" -> {"numeric": 0.9, "format": 0.1}."""
    weights: dict[str, float] = {}
    for part in spec.split(","):
        name, _, weight = part.strip().partition(":")
        try:
            weights[name] = float(weight) if weight else 1.0
        except ValueError:
            raise ValueError(f"reward spec {spec!r}: bad weight {weight!r} for {name!r}") from None
    combined(weights)  # rejects unknown names and non-positive totals
    return weights
