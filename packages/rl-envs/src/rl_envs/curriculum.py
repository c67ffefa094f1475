"""`Curriculum`: raise the difficulty level once evaluation passes a threshold."""

from __future__ import annotations

from dataclasses import dataclass

from rl_envs._checks import check_int, check_number


@dataclass(frozen=True)
class LevelChange:
    """One promotion: from `level` to `level + 1`, after an evaluation `score`."""

    level: int
    score: float


class Curriculum:
    """Difficulty that goes up when the policy is good enough at the current level.

        curriculum = Curriculum(max_level=RepeatAfterMe.max_level, threshold=0.8)
        task = mixture.sample(levels=curriculum.level)
        ...
        if curriculum.report(eval_result.mean_reward):   # True when it advanced
            print("now at level", curriculum.level)

    `report(score)` takes an evaluation score in [0, 1] (mean reward or success rate on the
    current level's evaluation set) and advances one level when `score >= threshold`,
    unless at `max_level`. `patience` asks for that many passing evaluations in a row.
    Pure Python.
    """

    def __init__(
        self, max_level: int, *, threshold: float = 0.8, start: int = 0, patience: int = 1
    ) -> None:
        self.max_level = check_int("Curriculum max_level", max_level, 0)
        self.threshold = check_number("Curriculum threshold", threshold, 0.0, 1.0)
        if self.threshold == 0.0:
            raise ValueError("Curriculum threshold must be > 0 (0 would advance on anything)")
        self.level = check_int("Curriculum start", start, 0)
        if self.level > self.max_level:
            raise ValueError(f"Curriculum start {start} is above max_level {max_level}")
        self.patience = check_int("Curriculum patience", patience, 1)
        self.history: list[LevelChange] = []
        self._passes = 0

    def report(self, score: float) -> bool:
        """Records an evaluation at the current level; returns True if the level went up."""
        score = check_number("Curriculum score", score, 0.0, 1.0)
        self._passes = self._passes + 1 if score >= self.threshold else 0
        if self._passes < self.patience or self.level >= self.max_level:
            return False
        self.history.append(LevelChange(self.level, float(score)))
        self.level += 1
        self._passes = 0
        return True

    @property
    def finished(self) -> bool:
        """At the top level."""
        return self.level >= self.max_level
