"""Admission control in one process: `put` / `wait_for_room` pace producers."""

from __future__ import annotations

import asyncio

import pytest
from replay_buffer import ReplayBuffer, ReplayBufferConfig
from replay_buffer.testing import make_episode, make_group, states_equal


async def settle() -> None:
    """Lets every ready task run until it blocks again."""
    for _ in range(5):
        await asyncio.sleep(0)


def test_has_room_counts_held_episodes_against_the_limit() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(admission_limit=3))
    buffer.add_many([make_episode(), make_episode()])
    assert buffer.has_room(1)
    assert not buffer.has_room(2)
    assert ReplayBuffer().has_room(10**9)  # no limit, always room


async def test_put_waits_while_full_and_adds_once_sampling_makes_room() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(admission_limit=4))
    await buffer.put([make_episode() for _ in range(3)])  # fits: returns at once
    blocked = asyncio.create_task(buffer.put([make_episode(), make_episode()]))
    await settle()
    assert not blocked.done()
    assert len(buffer) == 3
    assert buffer.sample(0, 1) is not None  # 2 held: now 2 more fit
    await asyncio.wait_for(blocked, timeout=5)
    assert len(buffer) == 4


async def test_add_never_waits_even_past_the_limit() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(admission_limit=2))
    buffer.add_many([make_episode() for _ in range(5)])  # add is the non-pacing path
    assert len(buffer) == 5
    assert not buffer.has_room(1)


async def test_wait_for_room_returns_when_stale_eviction_frees_room() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(admission_limit=2, max_policy_age=0))
    buffer.add_many([make_episode(policy_version=0), make_episode(policy_version=0)])
    waiter = asyncio.create_task(buffer.wait_for_room(1))
    await settle()
    assert not waiter.done()
    assert buffer.sample(1, 2) is None  # version 1 makes both stale: evicted, room freed
    await asyncio.wait_for(waiter, timeout=5)


async def test_several_waiting_producers_are_each_admitted_as_room_appears() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(admission_limit=2))
    buffer.add_many([make_episode(), make_episode()])
    producers = [asyncio.create_task(buffer.put([make_episode()])) for _ in range(3)]
    await settle()
    assert sum(p.done() for p in producers) == 0
    assert buffer.sample(0, 1) is not None
    await settle()
    assert sum(p.done() for p in producers) == 1
    assert len(buffer) == 2
    assert buffer.sample(0, 2) is not None
    await asyncio.wait_for(asyncio.gather(*producers), timeout=5)
    assert len(buffer) == 2


async def test_bad_put_fails_at_once_even_while_full() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(admission_limit=2, group_size=2))
    buffer.add_many(make_group("a", 2))
    before = buffer.state_dict()
    with pytest.raises(ValueError, match="group_id='b' has 1 episodes"):
        await asyncio.wait_for(buffer.put(make_group("b", 1)), timeout=5)
    with pytest.raises(ValueError, match="can never fit under admission_limit=2"):
        await asyncio.wait_for(buffer.put(make_group("c", 2) + make_group("d", 2)), timeout=5)
    with pytest.raises(ValueError, match="count must be an int >= 0"):
        await buffer.wait_for_room(-1)
    assert states_equal(buffer.state_dict(), before)


async def test_put_rechecks_group_ids_after_waiting() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(admission_limit=4, group_size=2))
    buffer.add_many(make_group("a", 2) + make_group("c", 2))
    late = asyncio.create_task(buffer.put(make_group("b", 2)))
    await settle()
    assert buffer.sample(0, 4) is not None  # room for the late put ...
    buffer.add_many(make_group("b", 2))  # ... but another producer adds a group "b" first
    with pytest.raises(ValueError, match="group_id='b' is already held"):
        await asyncio.wait_for(late, timeout=5)


async def test_a_cancelled_put_adds_nothing_and_leaves_no_waiter() -> None:
    buffer = ReplayBuffer(ReplayBufferConfig(admission_limit=1))
    buffer.add(make_episode())
    task = asyncio.create_task(buffer.put([make_episode()]))
    await settle()
    assert len(buffer._room) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(buffer._room) == 0
    assert len(buffer) == 1
    assert buffer.stats().added == 1
