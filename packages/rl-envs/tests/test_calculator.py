"""The calculator, a tool-use task: answers run in the real sandbox (bubblewrap)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pytest
from policies import Oracle, Payload, solve
from rl_envs import Action, Calculator, PolicyTurn, Sandbox, Segment, Task, run_episode
from rl_envs.envs.calculator import numbers_used

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def calculator(sandbox: Sandbox) -> Calculator:
    return Calculator()


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
    numbers, target = Calculator.content(task)
    answers = iter([f"{numbers[0]} + {numbers[1]} + 1000", solve(list(numbers), target)])

    async def policy(conversation: Sequence[Segment[Payload]]) -> PolicyTurn[Payload]:
        return PolicyTurn(next(answers), ())

    record = await run_episode(policy, calculator, task)
    assert record.rewards == (0.0, 0.5)
    assert record.segments[2].text == f"= {sum(numbers) + 1000}, not {target}"


async def test_the_right_value_with_other_numbers_is_wrong(calculator: Calculator) -> None:
    task = Task("calculator", seed=5, level=0)
    numbers, target = Calculator.content(task)
    await calculator.reset(task)
    result = await calculator.step(Action(str(target)))
    assert result.reward == 0.0
    assert not result.done
    listed = ", ".join(map(str, numbers))
    assert result.observation.text == f"= {target}, but use each of {listed} exactly once"
    result = await calculator.step(Action("1 +"))
    assert result.done
    assert result.reward == 0.0
    assert result.observation.text.startswith("error: SyntaxError")


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


def test_numbers_used_parses_without_running() -> None:
    assert numbers_used("(6 * 7) + 3") == {6: 1, 7: 1, 3: 1}
    assert numbers_used("__import__('os').system('x')") == {}
    assert numbers_used("1 +") is None
    assert numbers_used("1.5 + True + 2") == {2: 1}
