"""`packing.pack_rows`: where each response goes when a batch's responses are packed into
rows (hand-worked placements). That the packed pass gives every row's own log-probs and
gradients is checked in `test_shared_prompts.py`."""

import re

import pytest
from async_grpo.grpo.packing import pack_rows


def test_longest_first_each_into_the_row_it_fills_best() -> None:
    # Runs of 3 fill rows 0 and 1; the 2s open rows 2 and 3; the 1 goes where 1 place is
    # left first (row 2), a second prompt there.
    rows, offsets, held = pack_rows([3, 1, 2, 2, 3], [0, 0, 1, 1, 2], width=3, max_prompts=2)
    assert rows == [0, 2, 2, 3, 1]
    assert offsets == [0, 2, 0, 0, 0]
    assert held == [[0], [2], [1, 0], [1]]


def test_a_row_takes_no_more_prompts_than_allowed() -> None:
    rows, offsets, held = pack_rows([3, 1, 2, 2, 3], [0, 0, 1, 1, 2], width=3, max_prompts=1)
    assert rows == [0, 4, 2, 3, 1]
    assert offsets == [0] * 5
    assert held == [[0], [2], [1], [1], [0]]


def test_runs_of_one_prompt_share_a_row_whatever_the_cap() -> None:
    rows, offsets, held = pack_rows([1, 2, 1], [5, 5, 5], width=4, max_prompts=1)
    assert rows == [0, 0, 0]
    assert sorted(offsets) == [0, 2, 3]
    assert held == [[5]]


@pytest.mark.parametrize("lengths", [[0, 0, 2], [2, 0]])
def test_an_empty_response_still_takes_one_place(lengths: list[int]) -> None:
    rows, offsets, _ = pack_rows(lengths, [0] * len(lengths), width=2, max_prompts=1)
    places = {(r, o) for r, o in zip(rows, offsets, strict=True)}
    assert len(places) == len(lengths)  # no two responses at one place


@pytest.mark.parametrize(
    ("lengths", "prompts", "width", "max_prompts", "named"),
    [
        ([3, 1], [0, 0], 2, 1, "width 2"),
        ([1], [0], 1, 0, "max_prompts (0)"),
        ([1, 1], [0], 2, 1, "2 runs but 1 prompts"),
    ],
)
def test_bad_arguments_are_named(
    lengths: list[int], prompts: list[int], width: int, max_prompts: int, named: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(named)):
        pack_rows(lengths, prompts, width, max_prompts)
