"""`TaskMixture`: multi-task training, drawing each task's environment by weight."""

from __future__ import annotations

import random
from collections.abc import Mapping

from rl_envs._checks import check_int, check_name, check_number
from rl_envs.types import Task

_SEED_SPACE = 2**31


class TaskMixture:
    """Draws training tasks from several environments with the given weights.

        mixture = TaskMixture({"repeat": 2.0, "pattern": 1.0}, seed=0)
        task = mixture.sample(levels={"repeat": 1})    # Task("repeat", seed=..., level=1)

    Weights are relative (finite, >= 0, at least one > 0; a zero weight keeps a name known
    but never drawn). Draws are deterministic given `seed`; `state_dict` /
    `load_state_dict` resume the same sequence. Pure Python.
    """

    def __init__(self, weights: Mapping[str, float], *, seed: int = 0) -> None:
        given: object = weights
        if not isinstance(given, Mapping) or not given:
            raise ValueError(f"TaskMixture weights must be a non-empty mapping, got {weights!r}")
        clean: dict[str, float] = {}
        for name, weight in weights.items():
            check_name("a TaskMixture environment name", name)
            clean[name] = check_number(f"TaskMixture weight of {name!r}", weight, 0.0)
        if sum(clean.values()) <= 0:
            raise ValueError(f"TaskMixture needs a weight > 0, got {clean}")
        self.weights = clean
        self._names = list(clean)
        self._rng = random.Random(check_int("TaskMixture seed", seed, 0))
        self.drawn: dict[str, int] = dict.fromkeys(clean, 0)

    def sample(self, levels: Mapping[str, int] | int = 0) -> Task:
        """One training task: an environment drawn by weight, a fresh seed, and its level
        (`levels` gives one per environment, or one for all; missing names are level 0)."""
        name = self._rng.choices(self._names, weights=[self.weights[n] for n in self._names])[0]
        level = levels if isinstance(levels, int) else levels.get(name, 0)
        task = Task(name, self._rng.randrange(_SEED_SPACE), "train", level)
        self.drawn[name] += 1
        return task

    def fractions(self) -> dict[str, float]:
        """Each environment's target share of the draws (its normalised weight)."""
        total = sum(self.weights.values())
        return {name: w / total for name, w in self.weights.items()}

    def state_dict(self) -> dict[str, object]:
        return {"rng": self._rng.getstate(), "drawn": dict(self.drawn)}

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        drawn = state["drawn"]
        if not isinstance(drawn, dict) or set(drawn) != set(self.weights):
            raise ValueError("TaskMixture state is for other environments")
        self._rng.setstate(state["rng"])  # type: ignore[arg-type]
        self.drawn = dict(drawn)
