"""`sample_wait`: the trainer waits for a batch instead of polling `sample`."""

from __future__ import annotations

import asyncio
import time

import pytest
from replay_buffer import ReplayBuffer, ReplayBufferConfig
from replay_buffer.testing import make_episode, make_group


async def settle() -> None:
    """Lets every ready task run until it blocks again."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_returns_at_once_when_a_batch_is_held() -> None:
    buffer = ReplayBuffer()
    buffer.add_many([make_episode() for _ in range(4)])
    batch = await asyncio.wait_for(buffer.sample_wait(0, 4), timeout=5)
    assert batch is not None
    assert len(batch.episodes) == 4
    assert len(buffer) == 0


async def test_resumes_when_the_episode_completing_a_batch_arrives() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(group_size=2))
    waiting = asyncio.create_task(buffer.sample_wait(0, 4))
    buffer.add_many(make_group(0, 2))
    await settle()
    assert not waiting.done()  # one group of the two it needs
    buffer.add_many(make_group(1, 2))
    batch = await asyncio.wait_for(waiting, timeout=5)
    assert batch is not None
    assert [e.group_id for e in batch.episodes] == [0, 0, 1, 1]  # FIFO


async def test_stale_arrivals_do_not_complete_a_batch() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(max_policy_age=1))
    waiting = asyncio.create_task(buffer.sample_wait(5, 2))
    buffer.add_many([make_episode(policy_version=1), make_episode(policy_version=2)])
    await settle()
    assert not waiting.done()
    assert buffer.stats().evicted_stale == 2
    buffer.add_many([make_episode(policy_version=4), make_episode(policy_version=5)])
    batch = await asyncio.wait_for(waiting, timeout=5)
    assert batch is not None
    assert [e.policy_version for e in batch.episodes] == [4, 5]


async def test_times_out_with_none_and_takes_nothing() -> None:
    buffer = ReplayBuffer()
    buffer.add_many([make_episode()])
    start = time.monotonic()
    assert await buffer.sample_wait(0, 2, timeout=0.2) is None
    assert 0.15 <= time.monotonic() - start < 5
    assert len(buffer) == 1  # the held episode is still there
    assert await buffer.sample_wait(0, 2, timeout=0) is None  # zero: one try


async def test_bad_arguments_fail_before_waiting() -> None:
    buffer = ReplayBuffer()
    with pytest.raises(ValueError, match="timeout"):
        await buffer.sample_wait(0, 1, timeout=-1)
    with pytest.raises(ValueError, match="batch_size"):
        await asyncio.wait_for(buffer.sample_wait(0, 0), timeout=5)
