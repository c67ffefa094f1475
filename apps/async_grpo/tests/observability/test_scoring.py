"""How an evaluation is scored (`observability/scoring.py`): pass@k against hand-computed
values and the exact binomial formula, and the folding of answers into per-prompt rows."""

from fractions import Fraction
from math import comb

import pytest
from async_grpo.generation.decoding import Completion
from async_grpo.observability.scoring import (
    eval_seed,
    fold,
    mean_exact,
    mean_pass_at,
    mean_reward,
    pass_at_k,
    reward_inputs,
    score_eval,
)
from async_grpo.seeds import derive_seed
from async_grpo.tasks.prompts import Sample


def exact_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """1 - C(n-c, k) / C(n, k) in exact arithmetic."""
    return 1 - Fraction(comb(n - c, k), comb(n, k))


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (10, 3, 1, 0.3),  # pass@1 is the share of correct answers
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (6, 2, 3, 0.8),  # 1 - C(4,3)/C(6,3) = 1 - 4/20
        (8, 0, 8, 0.0),  # nothing correct: never
        (8, 8, 1, 1.0),
        (8, 1, 8, 1.0),  # k = n: any correct answer among them
        (3, 1, 3, 1.0),
        (200, 1, 100, 0.5),  # 1 - C(199,100)/C(200,100) = 1 - 100/200
    ],
)
def test_pass_at_k_by_hand(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_equals_the_binomial_formula_where_floats_cannot_hold_it() -> None:
    # C(2000, 1000) has 600 digits: as floats the binomials overflow and their ratio is lost.
    with pytest.raises(OverflowError):
        float(comb(2000, 1000))
    for n, c, k in [(2000, 1000, 100), (2000, 3, 500), (1000, 999, 1), (1000, 1, 999), (64, 7, 16)]:
        assert pass_at_k(n, c, k) == pytest.approx(float(exact_pass_at_k(n, c, k)), rel=1e-12)


def test_pass_at_k_refuses_impossible_counts() -> None:
    for n, c, k in [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)]:
        with pytest.raises(ValueError, match="pass_at_k"):
            pass_at_k(n, c, k)


def completion(text: str, version: int = 3) -> Completion:
    return Completion("p", text, [1], [2], [-0.5], True, version)


PROMPTS = [Sample("count to 2:", "1 2"), Sample("count to 1:", "1")]
GROUPS = [
    [completion("1 2"), completion("1"), completion("1 2"), completion("2")],
    [completion("1", version=4), completion("1 1", version=4)],
]
REWARDS = [1.0, 0.5, 1.0, 0.0, 1.0, 0.5]


def test_fold_gives_one_row_per_prompt_and_the_set_weighs_prompts_alike() -> None:
    texts, targets = reward_inputs(PROMPTS, GROUPS)
    assert texts == ["1 2", "1", "1 2", "2", "1", "1 1"]
    assert targets == ["1 2"] * 4 + ["1"] * 2
    rows = fold(PROMPTS, GROUPS, REWARDS)
    assert [r.prompt for r in rows] == ["count to 2:", "count to 1:"]
    assert rows[0].answers == ("1 2", "1", "1 2", "2")
    assert rows[0].reward == 0.625
    assert rows[1].reward == 0.75
    assert mean_reward(rows) == (0.625 + 0.75) / 2  # not the mean of all six answers
    assert rows[0].exact == 0.5
    assert mean_exact(rows) == 0.5
    assert [r.correct(1.0) for r in rows] == [2, 1]
    assert [r.correct(0.5) for r in rows] == [3, 2]
    assert rows[0].pass_at(2, 1.0) == pytest.approx(1 - 1 / 6)  # 1 - C(2,2)/C(4,2)
    assert mean_pass_at(rows, 1, 1.0) == pytest.approx((2 / 4 + 1 / 2) / 2)
    assert mean_pass_at(rows, 2, 1.0) == pytest.approx((5 / 6 + 1.0) / 2)


def test_score_eval_is_the_runs_record_of_the_same_rows() -> None:
    result = score_eval(40, PROMPTS, GROUPS, REWARDS)
    rows = fold(PROMPTS, GROUPS, REWARDS)
    assert result.step == 40
    assert result.version == 3  # the oldest version that sampled an answer
    assert result.reward == mean_reward(rows)
    assert result.exact == mean_exact(rows)
    assert result.per_prompt == (("count to 2:", 0.625), ("count to 1:", 0.75))


def test_fold_refuses_rewards_that_do_not_match_the_answers() -> None:
    with pytest.raises(ValueError, match="5 rewards for 6 answers"):
        fold(PROMPTS, GROUPS, REWARDS[:5])


def test_the_first_batch_is_seeded_as_the_runs_evaluation() -> None:
    # The run's evaluation after step 40 of a run seeded 7 drew from this seed before the
    # scoring was shared; `async-grpo eval` relies on it to reproduce that evaluation.
    assert eval_seed(7, 40) == derive_seed(7, "eval", 40)
    assert eval_seed(7, 40, 0) == eval_seed(7, 40)
    assert len({eval_seed(7, 40, i) for i in range(4)} | {eval_seed(7, 41)}) == 5
