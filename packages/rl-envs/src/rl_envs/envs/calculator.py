"""'Calculator', a tool-use task: the policy writes a computation as a Python expression,
the sandbox runs it, and the reward comes from what it printed."""

from __future__ import annotations

import ast
import random
from collections import Counter, OrderedDict
from typing import ClassVar

from rl_envs._checks import check_int, check_number
from rl_envs.environment import GeneratedEnvironment
from rl_envs.sandbox import ExecutionResult, Sandbox, SandboxLimits
from rl_envs.types import Action, Info, Observation, StepResult, Task

Puzzle = tuple[tuple[int, ...], tuple[str, ...]]
"""(numbers, operators): the computation `numbers[0] operators[0] numbers[1] ...`, evaluated
with Python's precedence; operators are "+", "-" or "*"."""

OPERATOR_WORDS = {"+": "plus", "-": "minus", "*": "times"}

# Runs inside the sandbox; the policy's expression arrives on stdin, so its text is never
# spliced into a program.
EVALUATE = (
    "import sys\nvalue = eval(compile(sys.stdin.read(), '<answer>', 'eval'))\nprint(repr(value))\n"
)

LIMITS = SandboxLimits(cpu_seconds=2, wall_seconds=5.0, memory_bytes=256 << 20,
                       output_bytes=4096, max_processes=4)  # fmt: skip
"""The sandbox limits of one evaluation: plenty for arithmetic, little for anything else."""

MAX_ANSWER_CHARS = 500

REUSED_RESULTS = 4096
"""Sandbox results of arithmetic answers one process keeps for reuse (least recently used
dropped first)."""

_ARITHMETIC = (
    ast.Expression,
    ast.BinOp,
    ast.UnaryOp,
    ast.Add,
    ast.Sub,
    ast.Mult,
    ast.UAdd,
    ast.USub,
)


def parse(expression: str) -> ast.Expression | None:
    """`expression` parsed (never run) on the host, or None if it is not a Python
    expression."""
    try:
        return ast.parse(expression, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def literals_used(expression: str) -> Counter[str] | None:
    """The literals of `expression` (parsed, never run, on the host; see `literals`), or
    None if it is not a Python expression."""
    tree = parse(expression)
    return None if tree is None else Counter(literals(tree))


def literals(tree: ast.Expression) -> tuple[str, ...]:
    """Every value `tree` writes down instead of computing, in the order written: each
    constant by its `repr` (an integer as its digits, so the question's numbers are
    `str(n)`; `13.0`, `True`, `None`, `'13'`, `13j` stay distinct from `13`) and each name
    by itself (`__debug__` is True; `int` in `int('13')` is a value brought in too)."""
    found = [
        (node.lineno, node.col_offset, repr(node.value) if isinstance(node, ast.Constant)
         else node.id)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant | ast.Name)
    ]  # fmt: skip
    return tuple(text for _, _, text in sorted(found))


def is_arithmetic(tree: ast.Expression) -> bool:
    """True when the expression is integer literals joined by + - * and signs (and
    parentheses): what it prints is fixed by its text, so one sandbox run answers for every
    copy of it."""
    return all(
        isinstance(node, _ARITHMETIC)
        or (isinstance(node, ast.Constant) and type(node.value) is int)
        for node in ast.walk(tree)
    )


def value_of(puzzle: Puzzle) -> int:
    """The value of the puzzle's computation (host-side arithmetic on the generated
    puzzle, never on an answer)."""
    numbers, operators = puzzle
    terms, signs, term = [], [1], numbers[0]
    for op, n in zip(operators, numbers[1:], strict=True):
        if op == "*":
            term *= n
        else:
            terms.append(term)
            signs.append(1 if op == "+" else -1)
            term = n
    terms.append(term)
    return sum(sign * t for sign, t in zip(signs, terms, strict=True))


class Calculator(GeneratedEnvironment[Puzzle]):
    """Hand a computation to the tool: the question states it in words, the policy writes it
    as a Python expression, the sandbox runs it, and the reward comes from what it printed.

    The first observation is "Compute 7 times 4 plus 2 with Python." The policy answers
    with an expression; the environment runs it in a bubblewrap `Sandbox` and answers with
    what it printed ("= 41, not 30", or the error's last line). The answer is right when
    the printed value equals the computation's (Python's precedence), the expression is
    integers joined by + - * (signs and parentheses allowed: `is_arithmetic`), and its
    literals are the question's numbers in the question's order: the expression is the
    computation the question states, so writing the value itself does not count, nor does
    `4 * 7` for "7 times 4" (a policy free to swap the numbers where the order does not
    matter learns no order to keep where it does: measured in docs/07), nor anything that
    brings in another value (`3 * 8 + False`, `3 + 8 + int('13')`, `len` of 13 empty
    lists) or another operator (`4 // 2` for "4 minus 2"). A right answer at attempt `k`
    earns `1 / k` and ends the episode; after `attempts` wrong ones (default 1: one answer,
    one run) it ends.

    A wrong attempt still earns partial credit, divided by `attempts` so that an episode's
    rewards stay in [0, 1]: `runs_credit` if the sandbox printed a number, plus
    `numbers_credit` times the share of the question's numbers among the expression's
    literals (`literals`: every constant it writes, of any type, and every name; matched
    as a multiset, over the larger of the two counts, so `3 + 8 + 13.0` uses two of three).
    Without it a random policy
    almost never writes a right expression and a run sees no signal (measured in
    docs/07_environments.md); 0 and 0 make the game strict. Once most answers run and use
    the right numbers the credit is a floor under a group's rewards: a trainer that divides
    by the group's mean reward should measure it from that floor (docs/07 measures why).

    A group of episodes writes the same answer many times. With `reuse_results` (default), an
    answer that is only integers joined by + - * (`is_arithmetic`) runs in the sandbox the
    first time its text is seen in this process, and later copies get that run's result
    (`info["reused"]`); any other answer runs every time, and so does a run that failed.

    Level `L` (0 to 2) has `L + 2` numbers from 1 to 9 joined by `L + 1` of + - *. Needs
    bubblewrap: constructing it raises `SandboxUnavailableError` without it (pass a
    `Sandbox` built with `unsafe_no_isolation=True` to debug without).
    """

    name = "calculator"
    max_level: ClassVar[int] = 2
    # Shared by the episodes of one process (each episode is its own instance); keyed by
    # the limits too, since a result depends on them.
    _reused: ClassVar[OrderedDict[tuple[SandboxLimits, str], ExecutionResult]] = OrderedDict()

    def __init__(
        self,
        sandbox: Sandbox | None = None,
        attempts: int = 1,
        runs_credit: float = 0.1,
        numbers_credit: float = 0.3,
        reuse_results: bool = True,
    ) -> None:
        super().__init__()
        self.attempts = check_int("Calculator attempts", attempts, 1)
        self.runs_credit = check_number("Calculator runs_credit", runs_credit, 0.0, 1.0)
        self.numbers_credit = check_number("Calculator numbers_credit", numbers_credit, 0.0, 1.0)
        if self.runs_credit + self.numbers_credit >= 1.0:
            raise ValueError(
                "Calculator runs_credit + numbers_credit must be < 1 (a right answer earns 1), "
                f"got {self.runs_credit} + {self.numbers_credit}"
            )
        self.sandbox = sandbox if sandbox is not None else Sandbox(LIMITS)
        self.reuse_results = reuse_results
        self._numbers: tuple[int, ...] = ()
        self._target = 0
        self._tries = 0

    @classmethod
    def generate(cls, rng: random.Random, level: int) -> Puzzle:
        numbers = tuple(rng.randint(1, 9) for _ in range(level + 2))
        return numbers, tuple(rng.choice("+-*") for _ in range(level + 1))

    @classmethod
    def question(cls, puzzle: Puzzle) -> str:
        numbers, operators = puzzle
        words = [str(numbers[0])]
        for op, n in zip(operators, numbers[1:], strict=True):
            words += [OPERATOR_WORDS[op], str(n)]
        return f"Compute {' '.join(words)} with Python."

    @classmethod
    def corpus(cls) -> list[str]:
        """Texts this environment says and answers look like: questions at every level, the
        digits, the operators and the feedback's words. A printed value is not listed (a
        word-level tokenizer reads "41" as one unknown word): every listed word is one more
        way for a random policy to be wrong, and the questions' numbers are 1 to 9."""
        rng = random.Random(0)
        questions = [
            cls.question(cls.generate(rng, level))
            for level in range(cls.max_level + 1)
            for _ in range(200)
        ]
        feedback = "= 4, not 5 correct error: too long not a number but use each of once in order"
        return [*questions, "0 1 2 3 4 5 6 7 8 9", "( ) + - * / ** %", feedback]

    async def _reset(self, task: Task) -> Observation:
        puzzle = self.content(task)
        self._numbers, self._target, self._tries = puzzle[0], value_of(puzzle), 0
        return Observation(self.question(puzzle))

    async def _step(self, action: Action) -> StepResult:
        self._tries += 1
        credit, feedback, info = await self._check(action.text.strip())
        right = credit == 1.0
        done = right or self._tries >= self.attempts
        reward = 1.0 / self._tries if right else credit / self.attempts
        return StepResult(Observation(feedback, info), reward=reward, done=done)

    async def _check(self, answer: str) -> tuple[float, str, Info]:
        """(credit: 1 when right, else the partial credit; feedback; info)."""
        if len(answer) > MAX_ANSWER_CHARS:
            return 0.0, f"too long: at most {MAX_ANSWER_CHARS} characters", {}
        tree = parse(answer)
        if tree is None:
            # Parsing is safe on the host; only running needs the sandbox.
            return 0.0, "error: SyntaxError: not a Python expression", {}
        written = literals(tree)
        used = Counter(written)
        result, reused = await self._run(answer, tree)
        info: Info = {
            "stopped": result.stopped,
            "exit_code": result.exit_code or 0,
            "reused": reused,
        }
        if not result.ok:
            lines = result.stderr.strip().splitlines() or [result.stopped]
            return 0.0, f"error: {lines[-1][:200]}", info
        printed = result.stdout.strip()
        try:
            value = ast.literal_eval(printed)
        except (ValueError, SyntaxError, RecursionError, MemoryError):
            return 0.0, f"= {printed[:100]}, not a number", info
        if not isinstance(value, int | float) or isinstance(value, bool):
            return 0.0, f"= {printed[:100]}, not a number", info
        asked = tuple(map(str, self._numbers))
        given = Counter(asked)
        # Arithmetic only: any other operator, call or attribute is a way to print the value
        # without writing the computation (4 // 2 for "4 minus 2", len() of 13 empty lists).
        if value == self._target and written == asked and is_arithmetic(tree):
            return 1.0, "correct", info
        shared = sum((used & given).values()) / max(sum(used.values()), sum(given.values()))
        credit = self.runs_credit + self.numbers_credit * shared
        if value != self._target:
            return credit, f"= {printed[:100]}, not {self._target}", info
        listed = ", ".join(asked)
        if written == asked:
            return credit, f"= {self._target}, but use {listed} with + - *", info
        if used == given:
            return credit, f"= {self._target}, but use {listed} in order", info
        return credit, f"= {self._target}, but use each of {listed} exactly once", info

    async def _run(self, answer: str, tree: ast.Expression) -> tuple[ExecutionResult, bool]:
        """The sandbox's result for `answer`, and whether it was an earlier run's."""
        if not (self.reuse_results and is_arithmetic(tree)):
            return await self.sandbox.arun(EVALUATE, stdin=answer), False
        key = (self.sandbox.limits, answer)
        cache = Calculator._reused
        if key in cache:
            cache.move_to_end(key)
            return cache[key], True
        result = await self.sandbox.arun(EVALUATE, stdin=answer)
        if not result.ok:
            return result, False  # arithmetic cannot fail: a loaded host's timeout, not kept
        cache[key] = result
        while len(cache) > REUSED_RESULTS:
            cache.popitem(last=False)
        return result, False

    async def _info(self) -> Info:
        return {"attempts": self._tries, "target": self._target}
