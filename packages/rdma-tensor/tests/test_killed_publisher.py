"""A publisher process SIGKILLed in the middle of publishing: the reader's pull fails within
a bounded time with a clear error, its weights keep the last good version, and no memory of
the dead publisher is left behind (no /dev/shm file, no mapping in the reader)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from monarch.actor import ProcMesh, this_host
from rdma_tensor import PublisherConfig, Transport
from sync_actors import Generator, Outcome, Trainer

# Several processes, seconds each: not in `nox -s fast`.
pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("transport", "pipelined"),
    [(Transport.SHM, True), (Transport.SHM, False), (Transport.RDMA, False)],
    ids=["shm-pipelined", "shm-waiting", "rdma"],
)
async def test_pull_fails_fast_and_cleanly_when_the_publisher_is_killed_mid_publish(
    procs: ProcMesh, transport: Transport, pipelined: bool
) -> None:
    """pipelined: the generator's version is still staged, so the pull starts copying the new
    version's first bucket before it stalls, and must undo that. waiting: the generator's
    version is gone from staging, so the pull waits for the new version to complete."""
    # conftest.py keeps Monarch's report of the deliberate kill from exiting pytest.
    doomed = this_host().spawn_procs(per_host={"procs": 1})
    try:
        trainer = doomed.spawn("trainer", Trainer, PublisherConfig(bucket_bytes=16 << 10))
        name = f"generator_killed_{transport.value}_{pipelined}"
        generator = procs.slice(procs=1).spawn(name, Generator)
        good = await trainer.publish.call_one(1)
        assert (await generator.try_pull.call_one(good, transport=transport)).result is not None
        if not pipelined:
            for version in (2, 3):  # both slots move past version 1
                await trainer.publish.call_one(version)
        _, rollbacks_before = await generator.pipeline_stats.call_one()
        half = await trainer.stage_first_bucket.call_one(4)
        pending = asyncio.ensure_future(
            generator.try_pull.call_one(half, transport=transport, timeout_s=60)
        )
        await asyncio.sleep(1.0)  # the generator is now waiting for version 4 to complete
        pid = await _kill_while_pending(trainer, pending, f"{transport.value}, {pipelined=}")
        assert await generator.holds.call_one(1)  # the last good version, untouched
        _, rollbacks = await generator.pipeline_stats.call_one()
        assert rollbacks - rollbacks_before == (1 if pipelined else 0)
        assert await generator.mapped_bytes.call_one(good) == 0
        assert not [f for f in os.listdir("/dev/shm") if str(pid) in f]
    finally:
        await doomed.stop()


async def _kill_while_pending(
    trainer: Trainer, pending: asyncio.Future[Outcome], label: str
) -> int:
    """SIGKILLs the trainer while `pending` (a pull) still waits; checks that the pull then
    fails within 10 s with `PublisherDiedError` naming the dead pid. Returns the pid."""
    assert not pending.done()
    pid: int = await trainer.pid.call_one()
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    outcome = await pending
    waited = time.monotonic() - killed_at
    print(f"pull failed {waited:.3f}s after the kill ({label})")
    assert outcome.error == "PublisherDiedError", outcome
    assert f"pid {pid}" in outcome.message
    assert "died" in outcome.message
    assert waited < 10.0, f"noticed the dead publisher only after {waited:.1f}s"
    return pid


async def test_mapped_weights_outlive_a_killed_publisher(procs: ProcMesh) -> None:
    """A generator running on a killed publisher's staging memory keeps running on it (Linux
    keeps mapped memory alive); its waiting pull and every later pull fail with
    `PublisherDiedError`, and `unmap` moves the weights into its own memory, after which
    nothing of the dead publisher is left."""
    doomed = this_host().spawn_procs(per_host={"procs": 1})
    try:
        trainer = doomed.spawn("trainer", Trainer, PublisherConfig(bucket_bytes=16 << 10))
        generator = procs.slice(procs=1).spawn("generator_killed_mapped", Generator, module=True)
        good = await trainer.publish.call_one(1)
        outcome = await generator.try_pull.call_one(good)
        assert outcome.result is not None
        assert outcome.result.mapped
        pending = asyncio.ensure_future(
            generator.try_pull.call_one(good, min_version=2, timeout_s=60)
        )
        await asyncio.sleep(0.5)  # the generator is now waiting for version 2
        pid = await _kill_while_pending(trainer, pending, "shm, mapped")
        assert await generator.is_mapped.call_one()
        assert await generator.holds.call_one(1)  # still readable, still version 1
        again = await generator.try_pull.call_one(good, timeout_s=5)
        assert again.error == "PublisherDiedError", again
        assert await generator.mapped_bytes.call_one(good) > 0  # pinned by the weights
        await generator.unmap.call_one()
        assert not await generator.is_mapped.call_one()
        assert await generator.holds.call_one(1)
        assert await generator.mapped_bytes.call_one(good) == 0
        assert not [f for f in os.listdir("/dev/shm") if str(pid) in f]
    finally:
        await doomed.stop()
