"""ReplayBufferActor in its own Monarch process, driven from the test and from producer
actors in other processes: sampling, errors, checkpoints, admission control pacing several
producers, and a clean shutdown while a producer is still waiting.

Starting a process costs seconds on a loaded 2-core machine (each imports torch), so the
tests share one module-wide mesh of three processes (buffer on the first, producers on the
other two) and stop their own actors; only the shutdown test starts and stops its own.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterator

import cloudpickle  # type: ignore[import-untyped]
import pytest
from monarch.actor import Actor, ActorError, ProcMesh, current_rank, endpoint, this_host
from replay_buffer import ReplayBuffer, ReplayBufferActor, ReplayBufferConfig
from replay_buffer.testing import make_episode, make_group

# Several processes, seconds each: not in `nox -s fast`.
pytestmark = pytest.mark.slow


class Pid(Actor):
    """Reports the process it runs in, to check that a stopped process is really gone."""

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


class Producer(Actor):
    """A generator stand-in: puts whole groups into the buffer, paced by admission control."""

    def __init__(self, buffer: ReplayBufferActor, group_size: int) -> None:
        self.buffer = buffer
        self.group_size = group_size
        self.rank = current_rank()["procs"]

    @endpoint
    async def produce(self, n_groups: int) -> int:
        for i in range(n_groups):
            group = make_group(f"p{self.rank}-g{i}", self.group_size, policy_version=0)
            await self.buffer.put.call_one(group)
        return n_groups


# Monarch pickles these classes with cloudpickle (a torchmonarch dependency). By reference,
# a worker process would import this module by the name pytest gave it, which only works
# from a source checkout's root; by value, they reach workers however the tests are run
# (e.g. against an installed wheel, from a scratch directory).
cloudpickle.register_pickle_by_value(sys.modules[__name__])


async def eventually(check: Callable[[], Awaitable[bool]], seconds: float = 30.0) -> None:
    """Polls `check()` (a remote state) until it holds; fails after `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"condition not reached within {seconds} s")


@pytest.fixture(scope="module")
def procs() -> Iterator[ProcMesh]:
    mesh = this_host().spawn_procs(per_host={"procs": 3})
    yield mesh
    mesh.stop().get(timeout=60)


async def test_add_sample_stats_and_errors_across_processes(procs: ProcMesh) -> None:
    home = procs.slice(procs=0)
    buffer = home.spawn("buffer1", ReplayBufferActor, ReplayBufferConfig(max_policy_age=1))
    try:
        pid = await home.spawn("pid1", Pid).pid.call_one()
        assert pid != os.getpid()  # the buffer lives in another process

        await buffer.add_many.call_one(
            [make_episode(policy_version=v, metadata={"id": v}) for v in range(3)]
        )
        await buffer.add.call_one(make_episode(policy_version=3, metadata={"id": 3}))
        assert await buffer.sample.call_one(3, 4) is None  # version 0 and 1 are too stale
        batch = await buffer.sample.call_one(3, 2)
        assert batch is not None
        assert [e.metadata["id"] for e in batch.episodes] == [2, 3]
        assert batch.episodes[0].behavior_logprobs.tolist() == [-0.5] * 4
        stats = await buffer.stats.call_one()
        assert (stats.added, stats.evicted_stale, stats.sampled, stats.held) == (4, 2, 2, 0)

        # A bad call reaches the caller with the buffer's own error; the actor keeps serving.
        with pytest.raises(ActorError) as info:
            await buffer.sample.call_one(2, 1)
        assert isinstance(info.value.exception, ValueError)
        assert "curr_policy_version 2 is lower than 3" in str(info.value.exception)
        assert (await buffer.stats.call_one()) == stats
    finally:
        await buffer.stop()


async def test_checkpoint_through_the_actor_resumes_identically(procs: ProcMesh) -> None:
    config = ReplayBufferConfig(sampling="uniform", max_resample_count=1, seed=11)
    buffer = procs.slice(procs=0).spawn("buffer2", ReplayBufferActor, config)
    try:
        await buffer.add_many.call_one([make_episode(metadata={"id": i}) for i in range(20)])
        await buffer.sample.call_one(0, 5)
        local = ReplayBuffer(config)
        local.load_state_dict(await buffer.state_dict.call_one())
        for _ in range(4):
            remote_batch = await buffer.sample.call_one(0, 5)
            local_batch = local.sample(0, 5)
            assert remote_batch is not None
            assert local_batch is not None
            assert [e.metadata["id"] for e in remote_batch.episodes] == [
                e.metadata["id"] for e in local_batch.episodes
            ]
        await buffer.load_state_dict.call_one(local.state_dict())
        assert (await buffer.stats.call_one()) == local.stats()
    finally:
        await buffer.stop()


async def test_snapshot_and_restore_cancel_what_waits(procs: ProcMesh) -> None:
    # What a run's checkpoint and rollback do: take the state and the groups held at one
    # instant, later put the buffer back there. Whatever waits in the buffer when it is
    # restored (a put for room, a trainer for a batch) belongs to the abandoned timeline.
    config = ReplayBufferConfig(admission_limit=4, max_buffer_size=8, group_size=2)
    buffer = procs.slice(procs=0).spawn("buffer5", ReplayBufferActor, config)
    try:
        tag = await buffer.put.call_one(make_group("a", 2, policy_version=3))
        await buffer.put.call_one(make_group("b", 2, policy_version=1))
        snap = await buffer.snapshot.call_one()
        assert sorted(snap.groups) == [("a", 3), ("b", 1)]
        put = asyncio.ensure_future(buffer.put.call_one(make_group("c", 2, policy_version=3)))
        await asyncio.sleep(0.5)
        assert not put.done()  # full: it waits for room
        await buffer.restore.call_one(snap.state)
        with pytest.raises(ActorError):
            await asyncio.wait_for(put, timeout=30)
        assert sorted((await buffer.snapshot.call_one()).groups) == sorted(snap.groups)

        await buffer.restore.call_one(None)  # empty, as new
        assert (await buffer.stats.call_one()).held == 0
        batch = asyncio.ensure_future(buffer.sample_wait.call_one(3, 4, 60.0))
        await asyncio.sleep(0.5)
        assert not batch.done()  # empty: the trainer waits
        await buffer.restore.call_one(snap.state)
        with pytest.raises(ActorError):
            await asyncio.wait_for(batch, timeout=30)
        assert (await buffer.stats.call_one()).held == 4  # nothing was taken

        with pytest.raises(ActorError):  # a bad state is refused, the buffer unchanged
            await buffer.restore.call_one({"not": "a state"})
        assert (await buffer.stats.call_one()).held == 4
        assert (await buffer.put.call_one([])) == tag  # the same process answers the same
    finally:
        await buffer.stop()


async def test_admission_control_paces_producers_in_other_processes(procs: ProcMesh) -> None:
    limit, group_size, per_producer = 8, 2, 6
    config = ReplayBufferConfig(admission_limit=limit, group_size=group_size)
    buffer = procs.slice(procs=0).spawn("buffer3", ReplayBufferActor, config)
    producers = procs.slice(procs=slice(1, 3)).spawn("producers3", Producer, buffer, group_size)
    try:
        production = asyncio.ensure_future(producers.produce.call(per_producer))

        async def full() -> bool:
            return (await buffer.stats.call_one()).held == limit

        await eventually(full)
        await asyncio.sleep(0.5)  # producers keep trying, but they must be waiting
        stats = await buffer.stats.call_one()
        assert (stats.added, stats.held, stats.evicted) == (limit, limit, 0)
        assert not production.done()

        # The trainer drains; every drained group lets a waiting producer in, never more.
        seen: list[str] = []
        while len(seen) < 2 * per_producer * group_size:
            batch = await buffer.sample.call_one(0, 4)
            if batch is None:
                await asyncio.sleep(0.01)
                continue
            seen += [f"{e.group_id}/{e.metadata['member']}" for e in batch.episodes]
            assert (await buffer.stats.call_one()).held <= limit
        done = await asyncio.wait_for(production, timeout=30)
        assert sorted(done.values()) == [per_producer, per_producer]
        assert len(set(seen)) == len(seen) == 2 * per_producer * group_size  # none lost
        final = await buffer.stats.call_one()
        assert (final.added, final.sampled, final.evicted, final.held) == (24, 24, 0, 0)
    finally:
        await producers.stop()
        await buffer.stop()


async def test_sample_wait_resumes_when_producers_in_other_processes_complete_a_batch(
    procs: ProcMesh,
) -> None:
    config = ReplayBufferConfig(group_size=2)
    buffer = procs.slice(procs=0).spawn("buffer4", ReplayBufferActor, config)
    producers = procs.slice(procs=slice(1, 3)).spawn("producers4", Producer, buffer, 2)
    try:
        assert await buffer.sample_wait.call_one(0, 4, 0.1) is None  # empty: times out
        waiting = asyncio.ensure_future(buffer.sample_wait.call_one(0, 8, 60.0))
        await asyncio.sleep(0.5)
        assert not waiting.done()
        await producers.produce.call(2)  # 2 producers x 2 groups x 2 episodes
        batch = await asyncio.wait_for(waiting, timeout=30)
        assert batch is not None
        assert len({e.group_id for e in batch.episodes}) == 4
    finally:
        await producers.stop()
        await buffer.stop()


async def test_wait_for_room_then_stop_releases_a_waiting_producer_and_ends_the_process() -> None:
    procs = this_host().spawn_procs(per_host={"procs": 1})
    buffer = procs.spawn("buffer", ReplayBufferActor, ReplayBufferConfig(admission_limit=2))
    pid = await procs.spawn("pid", Pid).pid.call_one()
    await buffer.put.call_one([make_episode(), make_episode()])

    # wait_for_room across processes: returns once a sample frees room.
    room = asyncio.ensure_future(buffer.wait_for_room.call_one(1))
    await asyncio.sleep(0.3)
    assert not room.done()
    assert await buffer.sample.call_one(0, 1) is not None
    await asyncio.wait_for(room, timeout=30)

    await buffer.add.call_one(make_episode())  # full again
    waiting = asyncio.ensure_future(buffer.put.call_one([make_episode()]))
    await asyncio.sleep(0.3)
    assert not waiting.done()  # full: the producer waits

    await procs.stop()
    # The waiting caller gets an error instead of hanging forever ...
    with pytest.raises(Exception, match="stopped"):
        await asyncio.wait_for(waiting, timeout=30)
    # ... and the buffer's process is gone.

    async def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    await eventually(gone)
