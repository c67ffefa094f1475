"""The `math` reward: a table of responses against targets with the score each must get,
math-verify's timeouts on a slow answer (on the main thread, refused off it), and the
checker process the reward actor uses off the main thread: its timeouts, and its deadline
when the process stops answering."""

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import pytest
from async_grpo.tasks.math_reward import MathWorker, math_score
from async_grpo.tasks.rewards import REWARDS, combined

# (response, target, score): the targets as `tasks.formats` reads them from a file.
TABLE = [
    # Thousands separators, in the response's box or after GSM8K's `####`.
    ("The answer is \\boxed{1,000}.", "1000", 1.0),
    ("250 * 4 = 1000\n#### 1,000", "1000", 1.0),
    # Decimals and fractions, either way round.
    ("She pays 2.5 dollars.", "2.5", 1.0),
    ("\\boxed{\\frac{5}{2}}", "2.5", 1.0),
    ("So it is 0.5", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\boxed{\\dfrac{3}{4}}", "\\frac{3}{4}", 1.0),
    ("\\boxed{0.75}", "\\dfrac{3}{4}", 1.0),
    ("2.50", "2.5", 1.0),
    ("\\boxed{1000.0}", "1000", 1.0),
    # LaTeX: equal expressions, sets, a unit or a currency sign around the number.
    ("\\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}", 1.0),
    ("\\boxed{\\{1, 2\\}}", "\\{2, 1\\}", 1.0),
    ("\\boxed{18 \\text{ apples}}", "18", 1.0),
    ("\\boxed{\\$18}", "18", 1.0),
    # The final answer counts, not the working around it.
    ("$\\boxed{18}$. Check: 18 - 2 = 16", "18", 1.0),
    ("First 12 apples, then 6 more: 18 in total.", "18", 1.0),
    # Wrong answers.
    ("The answer is 17", "18", 0.0),
    ("\\boxed{3}", "-3", 0.0),
    ("\\boxed{0.33}", "\\frac{1}{3}", 0.0),  # rounded too far
    ("\\boxed{\\pi}", "3.14", 0.0),
    ("\\boxed{(1, 2]}", "[1, 2)", 0.0),
    ("I do not know", "18", 0.0),
    ("", "18", 0.0),
]

# An answer sympy would spend minutes on: 9^(9^9) has 370 million digits.
SLOW = "\\boxed{9^{9^{9}}}"

T = TypeVar("T")


@pytest.mark.parametrize(("response", "target", "score"), TABLE)
def test_math_score_table(response: str, target: str, score: float) -> None:
    assert math_score(response, target) == score


def test_math_is_a_named_reward_and_combines() -> None:
    assert REWARDS["math"] is math_score
    fn = combined({"math": 0.9, "format": 0.1})
    assert fn("12", "12") == pytest.approx(1.0)
    assert fn("\\boxed{12}", "12") == pytest.approx(0.9)  # right, but not a bare integer
    assert fn("13", "12") == pytest.approx(0.1)


def test_a_slow_answer_times_out_on_the_main_thread() -> None:
    start = time.perf_counter()
    assert math_score(SLOW, "18", timeout_s=1) == 0.0
    # One parse and one comparison, each stopped by its alarm.
    assert time.perf_counter() - start < 10


def in_thread(fn: Callable[[], T]) -> T:
    """`fn()` run on a thread other than the main one (as a Monarch endpoint is)."""
    out: list[T] = []
    errors: list[BaseException] = []

    def body() -> None:
        try:
            out.append(fn())
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return out[0]


def test_off_the_main_thread_math_verify_refuses_its_timeouts() -> None:
    # Why the reward actor checks answers in a child process: its endpoints run off the
    # main thread, where math-verify's signal-based timeouts cannot be set.
    with pytest.raises(ValueError, match="doesn't support threaded environment"):
        in_thread(lambda: math_score("\\boxed{1}", "1"))


def test_worker_scores_the_table_off_the_main_thread() -> None:
    worker = in_thread(MathWorker)
    try:
        scores = in_thread(lambda: [worker(r, t) for r, t, _ in TABLE])
        assert scores == [s for _, _, s in TABLE]
        assert worker.killed == 0
    finally:
        worker.close()


@pytest.mark.slow  # a checker process, seconds
def test_worker_times_out_a_slow_answer_and_goes_on() -> None:
    worker = in_thread(lambda: MathWorker(timeout_s=1))
    try:
        pid = worker.pid
        start = time.perf_counter()
        assert in_thread(lambda: worker(SLOW, "18")) == 0.0
        assert time.perf_counter() - start < worker.deadline_s
        # math-verify's own alarm stopped it: the same process scores the next answer.
        assert in_thread(lambda: worker("\\boxed{18}", "18")) == 1.0
        assert (worker.pid, worker.killed) == (pid, 0)
    finally:
        worker.close()


@pytest.mark.slow  # a checker process, seconds
def test_worker_past_its_deadline_is_killed_and_replaced(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A check no signal can interrupt (one long call into C) looks like this from outside:
    # a process that does not answer. A stopped one does not either.
    worker = MathWorker(timeout_s=1, deadline_s=5.0)
    try:
        pid = worker.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        start = time.perf_counter()
        assert worker("\\boxed{18}", "18") == 0.0
        assert 5.0 <= time.perf_counter() - start < 15
        assert worker.killed == 1
        assert worker.pid is None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # killed and reaped
        assert "no score from the checker process" in capsys.readouterr().err
        assert worker("\\boxed{18}", "18") == 1.0  # a new process
        assert worker.pid not in (None, pid)
    finally:
        worker.close()


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_worker_ends_with_the_process_that_started_it() -> None:
    code = (
        "import os; from async_grpo.tasks.math_reward import MathWorker; "
        "print(MathWorker().pid, flush=True); os._exit(0)"  # no close: a death
    )
    parent = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True
    )
    assert parent.returncode == 0, parent.stderr
    pid = int(parent.stdout)
    deadline = time.monotonic() + 30
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid)
