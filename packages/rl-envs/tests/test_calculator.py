"""The calculator, a tool-use task: answers run in the real sandbox (bubblewrap)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from policies import Oracle, Payload, translate
from rl_envs import Action, Calculator, PolicyTurn, Sandbox, Segment, Task, run_episode
from rl_envs.envs.calculator import LIMITS, is_arithmetic, literals_used, parse, value_of
from rl_envs.sandbox import ExecutionResult, SandboxLimits

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def calculator(sandbox: Sandbox) -> Calculator:
    return Calculator(attempts=2)


async def test_right_answer_first_time_scores_one(calculator: Calculator) -> None:
    record = await run_episode(Oracle(), calculator, Task("calculator", seed=3, level=1))
    assert record.ok
    assert record.done
    assert record.rewards == (1.0,)
    assert record.segments[-1].text == "correct"


async def test_second_attempt_scores_half_and_feedback_shows_the_result(
    calculator: Calculator,
) -> None:
    task = Task("calculator", seed=4, level=0)
    (a, b), _ = puzzle = Calculator.content(task)
    target = value_of(puzzle)
    answers = iter([f"{a} + {b} + 1000", translate(Calculator.question(puzzle))])

    async def policy(conversation: Sequence[Segment[Payload]]) -> PolicyTurn[Payload]:
        return PolicyTurn(next(answers), ())

    record = await run_episode(policy, calculator, task)
    # The first attempt ran and printed a number (0.1) and used both numbers among three
    # literals (0.3 * 2/3), halved over two attempts; the second is right: 1/2.
    assert record.rewards == pytest.approx((0.15, 0.5))
    assert record.segments[2].text == f"= {a + b + 1000}, not {target}"


async def test_the_right_value_with_other_numbers_is_wrong(calculator: Calculator) -> None:
    task = Task("calculator", seed=5, level=0)
    puzzle = Calculator.content(task)
    target = value_of(puzzle)
    await calculator.reset(task)
    result = await calculator.step(Action(str(target)))
    assert not result.done
    listed = ", ".join(map(str, puzzle[0]))
    assert result.observation.text == f"= {target}, but use each of {listed} exactly once"
    result = await calculator.step(Action("1 +"))
    assert result.done
    assert result.reward == 0.0
    assert result.observation.text.startswith("error: SyntaxError")


async def test_the_numbers_must_be_in_the_questions_order(sandbox: Sandbox) -> None:
    # "a times b" answered "b * a": the right value from the right numbers, swapped.
    task = next(
        t
        for t in (Task("calculator", seed=s) for s in range(100))
        if (c := Calculator.content(t))[1][0] in "+*" and c[0][0] != c[0][1]
    )
    (a, b), (op,) = puzzle = Calculator.content(task)
    calculator = Calculator(attempts=2)
    await calculator.reset(task)
    result = await calculator.step(Action(f"{b} {op} {a}"))
    assert not result.done
    # Wrong, with the partial credit of an answer that ran and used both numbers.
    assert result.reward == pytest.approx((0.1 + 0.3) / 2)
    assert result.observation.text == f"= {value_of(puzzle)}, but use {a}, {b} in order"
    result = await calculator.step(Action(f"({a}) {op} {b}"))
    assert result.done
    assert result.reward == pytest.approx(0.5)
    assert result.observation.text == "correct"


async def test_the_order_is_the_written_order_at_every_level(sandbox: Sandbox) -> None:
    # "a times b plus c" parses as (a * b) + c, whose tree lists c before a and b: the
    # literals are read in the order they are written, not in the tree's.
    tasks = [Task("calculator", seed=s, level=level) for level in (1, 2) for s in range(12)]
    assert any(Calculator.question(Calculator.content(t)).split()[2] == "times" for t in tasks)
    for task in tasks:
        calculator = Calculator()
        await calculator.reset(task)
        answer = translate(Calculator.question(Calculator.content(task)))
        assert (await calculator.step(Action(answer))).reward == 1.0, answer


async def test_partial_credit_counts_what_ran_and_the_numbers_used(sandbox: Sandbox) -> None:
    task = Task("calculator", seed=6, level=1)
    (a, b, c), _ = Calculator.content(task)
    strict = Calculator(attempts=4, runs_credit=0.0, numbers_credit=0.0)
    graded = Calculator(attempts=4, runs_credit=0.2, numbers_credit=0.4)
    for env in (strict, graded):
        await env.reset(task)
    answers = [f"{a} +", "0", f"{a} + {b}", f"({a}) - ({b}) + 10 * {c}"]
    # Per attempt, before dividing by 4: not an expression; ran, no number of the question;
    # ran, two of its three numbers; ran, all three among four literals.
    expected = [0.0, 0.2, 0.2 + 0.4 * 2 / 3, 0.2 + 0.4 * 3 / 4]
    for answer, credit in zip(answers, expected, strict=True):
        assert (await strict.step(Action(answer))).reward == 0.0
        result = await graded.step(Action(answer))
        assert result.reward == pytest.approx(credit / 4), answer
    assert result.done


async def test_one_attempt_by_default(sandbox: Sandbox) -> None:
    calculator = Calculator()
    await calculator.reset(Task("calculator", seed=2))
    result = await calculator.step(Action("1 + 1 + 1"))
    assert result.done
    assert result.reward == pytest.approx(0.1)  # it ran and printed a number; none of its 3


def task_for(numbers: tuple[int, ...], operators: tuple[str, ...]) -> Task:
    """A train task whose content is the computation `numbers` joined by `operators`."""
    return next(
        task
        for task in (Task("calculator", seed=s) for s in range(100_000))
        if Calculator.content(task) == (numbers, operators)
    )


# "Compute 3 times 8": each prints 24, and each writes 3 and 8 in order as its only
# integer literals; none of them is the computation the question states.
THREE_TIMES_EIGHT_CHEATS = [
    "3 + 8 + 13.0",  # a float literal
    "3 * 8 + False",  # a bool literal
    "3 * 8 * True",
    "3 + 8 + (13j).imag",  # a complex literal
    "3 * 8 + (None is not None)",  # None
    "3 + 8 + int('13')",  # a number written as a string
    "3 + 8 + len('abcdefghijklm')",
    "3 + 8 + len(b'abcdefghijklm')",
    "3 * 8 * __debug__",  # a name whose value is True
    "3 + 8 + len([[], [], [], [], [], [], [], [], [], [], [], [], []])",  # no literal at all
    "3 * 8 * ([] == [])",
]


async def test_answers_that_bring_in_other_values_are_wrong(sandbox: Sandbox) -> None:
    task = task_for((3, 8), ("*",))
    assert Calculator.question(Calculator.content(task)) == "Compute 3 times 8 with Python."
    for answer in THREE_TIMES_EIGHT_CHEATS:
        calculator = Calculator()
        await calculator.reset(task)
        result = await calculator.step(Action(answer))
        assert result.observation.text.startswith("= 24, but"), (answer, result)
        assert result.reward < 1.0, answer
    # The honest answer, checked the same way, is right.
    calculator = Calculator()
    await calculator.reset(task)
    assert (await calculator.step(Action("3 * 8"))).reward == 1.0


async def test_the_numbers_other_literals_dilute_the_partial_credit(sandbox: Sandbox) -> None:
    task = task_for((3, 8), ("*",))
    # 0.1 for the run, and 0.3 times the question's 2 numbers over the literals written
    # (`int` and '13' are two).
    for answer, written in [("3 + 8 + 13.0", 3), ("3 * 8 + False", 3), ("3 + 8 + int('13')", 4)]:
        calculator = Calculator()
        await calculator.reset(task)
        result = await calculator.step(Action(answer))
        assert result.reward == pytest.approx(0.1 + 0.3 * 2 / written), answer
        assert result.observation.text == "= 24, but use each of 3, 8 exactly once"


async def test_operators_the_question_does_not_say_are_wrong(sandbox: Sandbox) -> None:
    # "4 minus 2" is 2, and so are these: the right numbers in the right order, but not
    # the computation.
    task = task_for((4, 2), ("-",))
    for answer in ["4 // 2", "4 / 2", "(4).__floordiv__(2)"]:
        calculator = Calculator()
        await calculator.reset(task)
        result = await calculator.step(Action(answer))
        assert result.reward == pytest.approx(0.1 + 0.3), answer
        assert result.observation.text == "= 2, but use 4, 2 with + - *", answer


def test_value_of_follows_python_precedence() -> None:
    assert value_of(((7, 4, 2), ("+", "*"))) == 15
    assert value_of(((7, 4, 2), ("*", "-"))) == 26
    assert value_of(((2, 3, 4, 5), ("-", "*", "+"))) == -5
    assert Calculator.question(((7, 4, 2), ("+", "*"))) == "Compute 7 plus 4 times 2 with Python."


def test_credits_that_could_outscore_a_right_answer_are_refused() -> None:
    with pytest.raises(ValueError, match="runs_credit \\+ numbers_credit must be < 1"):
        Calculator(runs_credit=0.5, numbers_credit=0.5)
    with pytest.raises(ValueError, match="numbers_credit must be in"):
        Calculator(numbers_credit=-0.1)


async def test_a_hostile_answer_runs_in_the_sandbox(calculator: Calculator, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("42")
    await calculator.reset(Task("calculator", seed=0))
    result = await calculator.step(Action(f"int(open({str(secret)!r}).read())"))
    assert result.reward == 0.0
    assert "FileNotFoundError" in result.observation.text
    marker = tmp_path / "pwned"
    result = await calculator.step(Action(f"__import__('os').system('touch {marker}') or 1"))
    assert result.done
    assert "pwned" not in os.listdir(tmp_path)


def test_literals_used_parses_without_running() -> None:
    assert literals_used("(6 * 7) + 3") == {"6": 1, "7": 1, "3": 1}
    assert literals_used("__import__('os').system('x')") == {
        "__import__": 1, "'os'": 1, "'x'": 1
    }  # fmt: skip
    assert literals_used("1 +") is None
    # Each kept apart from the integer it equals: 1.0 == True == 1 in Python.
    assert literals_used("1.0 + True + 1 + 1j + None + b'1' + '1' + ...") == {
        "1.0": 1, "True": 1, "1": 1, "1j": 1, "None": 1, "b'1'": 1, "'1'": 1, "Ellipsis": 1
    }  # fmt: skip
    assert literals_used("0x18 + __debug__") == {"24": 1, "__debug__": 1}


class CountingSandbox(Sandbox):
    """The real sandbox, counting its runs."""

    runs = 0

    async def arun(
        self, program: str, *, stdin: str = "", limits: SandboxLimits | None = None
    ) -> ExecutionResult:
        self.runs += 1
        return await super().arun(program, stdin=stdin, limits=limits)


@pytest.fixture
def fresh_results() -> Iterator[None]:
    Calculator._reused.clear()
    yield
    Calculator._reused.clear()


async def test_a_repeated_arithmetic_answer_runs_in_the_sandbox_once(
    sandbox: Sandbox, fresh_results: None
) -> None:
    counting = CountingSandbox(LIMITS)
    task = Task("calculator", seed=3)
    right = translate(Calculator.question(Calculator.content(task)))
    results = []
    for answer in [right, right, f"({right})", "int('4') + 1", "int('4') + 1"]:
        episode = Calculator(counting)  # each episode its own instance, as in a service
        await episode.reset(task)
        results.append(await episode.step(Action(answer)))
    assert [r.observation.info["reused"] for r in results] == [False, True, False, False, False]
    assert [r.reward for r in results[:3]] == [1.0, 1.0, 1.0]
    assert results[0].observation.text == results[1].observation.text == "correct"
    # The parenthesised copy is other text (run again); the non-arithmetic answer runs twice.
    assert counting.runs == 4
    assert (
        results[3].observation.text
        == results[4].observation.text
        == "= 5, not " + str(value_of(Calculator.content(task)))
    )


async def test_without_reuse_every_answer_runs(sandbox: Sandbox, fresh_results: None) -> None:
    counting = CountingSandbox(LIMITS)
    for _ in range(2):
        episode = Calculator(counting, reuse_results=False)
        await episode.reset(Task("calculator", seed=3))
        result = await episode.step(Action("2 + 2"))
        assert result.observation.info["reused"] is False
    assert counting.runs == 2


async def test_a_failed_run_is_not_reused(sandbox: Sandbox, fresh_results: None) -> None:
    # 1 MiB of address space: the interpreter cannot even start, so the run fails.
    starved = CountingSandbox(SandboxLimits(memory_bytes=1 << 20))
    for _ in range(2):
        episode = Calculator(starved)
        await episode.reset(Task("calculator", seed=3))
        result = await episode.step(Action("2 + 2"))
        assert result.observation.text.startswith("error")
        assert result.observation.info["reused"] is False
    assert starved.runs == 2
    assert not Calculator._reused


def test_is_arithmetic_admits_only_integers_and_plus_minus_times() -> None:
    def arithmetic(text: str) -> bool:
        tree = parse(text)
        assert tree is not None
        return is_arithmetic(tree)

    assert arithmetic("7 * 4")
    assert arithmetic("-(3 + 2) * +4 - 1")
    for other in ["2 ** 8", "7 / 2", "1.5 + 1", "True + 1", "x + 1", "len('ab')", "(1, 2)"]:
        assert not arithmetic(other), other
