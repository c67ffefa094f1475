"""`controller.prefetch`: a call's prompts are the dataset's, in its order, whether they were
asked for ahead, asked again after a rollback, or asked again after a failed prefetch."""

from __future__ import annotations

import asyncio

import pytest
from async_grpo.controller.prefetch import PromptPrefetch
from async_grpo.tasks.prompts import Sample


class Dataset:
    """Prompt i is "p<i>"; records every question; fails the questions listed in `fail`."""

    def __init__(self) -> None:
        self.asked: list[list[int]] = []
        self.fail: set[int] = set()

    async def fetch(self, indices: list[int]) -> list[Sample]:
        self.asked.append(list(indices))
        await asyncio.sleep(0)
        if self.fail.intersection(indices):
            raise RuntimeError("no healthy replica")
        return [Sample(f"p{i}", str(i)) for i in indices]


def prompts(samples: list[Sample]) -> list[str]:
    return [s.prompt for s in samples]


async def settle() -> None:
    """Lets the questions asked ahead run (a call returns without waiting for them)."""
    for _ in range(3):
        await asyncio.sleep(0)


async def test_the_next_calls_are_asked_for_with_this_one() -> None:
    data = Dataset()
    prefetch = PromptPrefetch(data.fetch, ahead=4)
    assert prompts(await prefetch.samples([0, 1], next_index=2)) == ["p0", "p1"]
    await settle()
    assert data.asked == [[0, 1], [2, 3, 4, 5]]
    # The next call finds its prompts asked for already; only the ones after it are asked.
    assert prompts(await prefetch.samples([2, 3], next_index=4)) == ["p2", "p3"]
    await settle()
    assert data.asked[2:] == [[6, 7]]
    assert prompts(await prefetch.samples([4, 5], next_index=6)) == ["p4", "p5"]
    await settle()
    assert data.asked[3:] == [[8, 9]]


async def test_prompts_are_asked_for_a_chunk_at_a_time() -> None:
    data = Dataset()
    prefetch = PromptPrefetch(data.fetch, ahead=4, chunk=8)
    await prefetch.samples([0, 1], next_index=2)
    await settle()
    assert data.asked == [[0, 1], [2, 3, 4, 5, 6, 7, 8, 9]]
    # While `ahead` prompts after the next index are asked for, nothing more is asked.
    for first in (2, 4):
        call = [first, first + 1]
        assert prompts(await prefetch.samples(call, next_index=first + 2)) == [
            f"p{i}" for i in call
        ]
    await settle()
    assert data.asked[2:] == []
    # Below that, the next chunk: from where the asking stopped, eight at least.
    assert prompts(await prefetch.samples([6, 7], next_index=8)) == ["p6", "p7"]
    await settle()
    assert data.asked[2:] == [[10, 11, 12, 13, 14, 15, 16, 17]]


async def test_a_call_drawn_again_or_after_a_rollback_is_asked_again() -> None:
    data = Dataset()
    prefetch = PromptPrefetch(data.fetch, ahead=2)
    await prefetch.samples([0, 1], next_index=2)
    await prefetch.samples([2, 3], next_index=4)
    await settle()
    del data.asked[:]
    # A call drawn again (its group was lost) mixed with one prefetched index.
    assert prompts(await prefetch.samples([1, 0, 4], next_index=5)) == ["p1", "p0", "p4"]
    await settle()
    assert data.asked == [[1, 0], [6]]
    # A rollback to index 2: nothing prefetched is lost or answered wrong.
    assert prompts(await prefetch.samples([2, 3], next_index=4)) == ["p2", "p3"]
    assert prompts(await prefetch.samples([5, 6], next_index=7)) == ["p5", "p6"]


async def test_a_failed_prefetch_is_asked_again_and_a_real_failure_raises() -> None:
    data = Dataset()
    prefetch = PromptPrefetch(data.fetch, ahead=2)
    data.fail = {2}
    await prefetch.samples([0, 1], next_index=2)
    await settle()  # the prefetch of [2, 3] failed
    data.fail = set()
    assert prompts(await prefetch.samples([2, 3], next_index=4)) == ["p2", "p3"]
    assert data.asked.count([2, 3]) == 2  # the failed prefetch, then the call's own
    data.fail = {6}
    with pytest.raises(RuntimeError, match="no healthy replica"):
        await prefetch.samples([4, 5, 6], next_index=7)


async def test_a_call_naming_a_prompt_twice_is_refused() -> None:
    with pytest.raises(ValueError, match=r"prompt indices must differ, got \[3, 4, 3\]"):
        await PromptPrefetch(Dataset().fetch, ahead=2).samples([3, 4, 3], next_index=5)


def test_ahead_or_chunk_below_zero_is_named() -> None:
    with pytest.raises(ValueError, match="ahead must be >= 0"):
        PromptPrefetch(Dataset().fetch, ahead=-1)
    with pytest.raises(ValueError, match="chunk must be >= 0, got -2"):
        PromptPrefetch(Dataset().fetch, ahead=2, chunk=-2)
