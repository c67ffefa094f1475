"""'Calculator', a tool-use task: the policy writes a Python expression, the sandbox runs
it, and the reward comes from what it printed."""

from __future__ import annotations

import ast
import random
from collections import Counter
from typing import ClassVar

from rl_envs._checks import check_int
from rl_envs.environment import GeneratedEnvironment
from rl_envs.sandbox import Sandbox, SandboxLimits
from rl_envs.types import Action, Info, Observation, StepResult, Task

Puzzle = tuple[tuple[int, ...], int]
"""(numbers, target): reach `target` using each number exactly once."""

# Runs inside the sandbox; the policy's expression arrives on stdin, so its text is never
# spliced into a program.
EVALUATE = (
    "import sys\nvalue = eval(compile(sys.stdin.read(), '<answer>', 'eval'))\nprint(repr(value))\n"
)

LIMITS = SandboxLimits(cpu_seconds=2, wall_seconds=5.0, memory_bytes=256 << 20,
                       output_bytes=4096, max_processes=4)  # fmt: skip
"""The sandbox limits of one evaluation: plenty for arithmetic, little for anything else."""

MAX_ANSWER_CHARS = 500


def numbers_used(expression: str) -> Counter[int] | None:
    """The integer literals of `expression` (parsed, never run, on the host), or None if
    it is not a Python expression."""
    try:
        tree = ast.parse(expression, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return Counter(
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and type(node.value) is int
    )


class Calculator(GeneratedEnvironment[Puzzle]):
    """Write an expression that reaches a target, checked by running it in the sandbox.

    The first observation gives the numbers and the target. The policy answers with a
    Python expression; the environment runs it in a bubblewrap `Sandbox` and answers with
    what it printed ("= 41, not 45", or the error's last line). The answer is right when
    the printed value equals the target and the expression's integer literals are exactly
    the given numbers. A right answer at attempt `k` earns `1 / k` and ends the episode;
    after `attempts` wrong ones it ends with 0. Rewards are in [0, 1].

    Level `L` (0 to 2) uses `L + 2` numbers from 1 to 9, combined with + - * into the
    target. Needs bubblewrap: constructing it raises `SandboxUnavailableError` without it
    (pass a `Sandbox` built with `unsafe_no_isolation=True` to debug without).
    """

    name = "calculator"
    max_level: ClassVar[int] = 2

    def __init__(self, sandbox: Sandbox | None = None, attempts: int = 2) -> None:
        super().__init__()
        self.attempts = check_int("Calculator attempts", attempts, 1)
        self.sandbox = sandbox if sandbox is not None else Sandbox(LIMITS)
        self._numbers: tuple[int, ...] = ()
        self._target = 0
        self._tries = 0

    @classmethod
    def generate(cls, rng: random.Random, level: int) -> Puzzle:
        numbers = [rng.randint(1, 9) for _ in range(level + 2)]
        target = numbers[0]
        for n in numbers[1:]:
            op = rng.choice("+-*")
            # Either side, so that a target is not always left-to-right arithmetic.
            left, right = (target, n) if rng.random() < 0.5 else (n, target)
            target = left + right if op == "+" else left - right if op == "-" else left * right
        return tuple(sorted(numbers)), int(target)

    @classmethod
    def question(cls, numbers: tuple[int, ...], target: int) -> str:
        listed = ", ".join(map(str, numbers))
        return (
            f"Write a Python expression equal to {target} that uses each of the numbers "
            f"{listed} exactly once (with + - * and parentheses)."
        )

    @classmethod
    def corpus(cls) -> list[str]:
        """Texts this environment says and answers look like: questions at every level,
        every number from -99 to 999 (each a word to a word-level tokenizer) and the
        feedback's words."""
        rng = random.Random(0)
        questions = [
            cls.question(*cls.generate(rng, level))
            for level in range(cls.max_level + 1)
            for _ in range(200)
        ]
        numbers = " ".join(str(n) for n in range(-99, 1000))
        feedback = "= 41, not 45 correct error: too long not a number but use each of once"
        return [*questions, numbers, "( ) + - * / ** %", feedback]

    async def _reset(self, task: Task) -> Observation:
        (self._numbers, self._target), self._tries = self.content(task), 0
        return Observation(self.question(self._numbers, self._target))

    async def _step(self, action: Action) -> StepResult:
        self._tries += 1
        right, feedback, info = await self._check(action.text)
        done = right or self._tries >= self.attempts
        reward = 1.0 / self._tries if right else 0.0
        return StepResult(Observation(feedback, info), reward=reward, done=done)

    async def _check(self, answer: str) -> tuple[bool, str, Info]:
        if len(answer) > MAX_ANSWER_CHARS:
            return False, f"too long: at most {MAX_ANSWER_CHARS} characters", {}
        result = await self.sandbox.arun(EVALUATE, stdin=answer.strip())
        info: Info = {"stopped": result.stopped, "exit_code": result.exit_code or 0}
        if not result.ok:
            lines = result.stderr.strip().splitlines() or [result.stopped]
            return False, f"error: {lines[-1][:200]}", info
        printed = result.stdout.strip()
        try:
            value = ast.literal_eval(printed)
        except (ValueError, SyntaxError, RecursionError, MemoryError):
            return False, f"= {printed[:100]}, not a number", info
        if not isinstance(value, int | float) or isinstance(value, bool):
            return False, f"= {printed[:100]}, not a number", info
        if value != self._target:
            return False, f"= {printed[:100]}, not {self._target}", info
        if numbers_used(answer) != Counter(self._numbers):
            listed = ", ".join(map(str, self._numbers))
            return False, f"= {self._target}, but use each of {listed} exactly once", info
        return True, "correct", info

    async def _info(self) -> Info:
        return {"attempts": self._tries, "target": self._target}
