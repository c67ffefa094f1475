"""A source process SIGKILLed after publishing: each destination's pull fails at once with
rdma-tensor's clear error, and the destination shards are left exactly as they were (for
`pull_plan` in both modes, and for the versioned `pull` of a `ShardedPublisher`'s version)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
import torch
from dtensor_reshard import Layout, PlanCache, merge, pull, pull_plan
from monarch.actor import this_host
from monarch.spmd import setup_torch_elastic_env_async
from rdma_tensor import PublisherDiedError
from reshard_actors import PlainSource, ShardedTrainerRank, version_weights
from torch.distributed.tensor import Replicate, Shard

# Several processes, seconds each: not in `nox -s fast`.
pytestmark = pytest.mark.slow


async def _until_dead(pid: int) -> None:
    """SIGKILL is asynchronous: wait until the process has stopped running (gone or zombie)."""
    for _ in range(200):
        try:
            with open(f"/proc/{pid}/stat") as f:  # noqa: ASYNC230 (procfs, never blocks)
                if f.read().split(") ")[1].startswith(("Z", "X")):
                    return
        except FileNotFoundError:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"pid {pid} still running 10 s after SIGKILL")


async def test_pull_from_a_killed_source_fails_cleanly_in_both_modes() -> None:
    src = {"w": Layout((6, 4), torch.float32, (1,), (Replicate(),))}
    dst = {"w": Layout((6, 4), torch.float32, (2,), (Shard(0),))}
    plan = PlanCache().get(src, dst)
    full = torch.randn(6, 4)
    doomed = this_host().spawn_procs(per_host={"procs": 1})
    try:
        source = doomed.spawn("source", PlainSource)
        exports = {
            staged: await source.publish.call_one(plan, 0, {"w": full}, staged)
            for staged in (False, True)
        }
        for export in exports.values():
            out = torch.zeros(3, 4)
            await pull_plan(plan, 0, [export], {"w": out})  # alive: the pull works
            assert torch.equal(out, full[:3])

        pid = await source.pid.call_one()
        os.kill(pid, signal.SIGKILL)
        await _until_dead(pid)
        for staged, export in exports.items():
            untouched = torch.full((3, 4), 5.0)
            with pytest.raises(PublisherDiedError, match=f"pid {pid}"):
                await pull_plan(plan, 1, [export], {"w": untouched})
            assert bool((untouched == 5.0).all()), f"staged={staged} changed the destination"
    finally:
        await doomed.stop()


async def test_versioned_pull_from_a_killed_rank_leaves_into_untouched() -> None:
    doomed = this_host().spawn_procs(per_host={"procs": 1})
    try:
        await setup_torch_elastic_env_async(doomed)
        trainer = doomed.spawn("trainer", ShardedTrainerRank)
        await trainer.setup.call()
        await trainer.step.call(1)
        manifest = merge(list((await trainer.publish.call(1)).values()))
        into = {n: torch.zeros_like(t) for n, t in version_weights(0).items()}
        assert (await pull(manifest, into=into)).version == 1  # alive: the pull works
        assert all(torch.equal(into[n], t) for n, t in version_weights(1).items())
        for t in into.values():
            t.fill_(5.0)  # what a partial write would be seen against

        pid = (await trainer.pid.call()).item(procs=0)
        os.kill(pid, signal.SIGKILL)
        await _until_dead(pid)
        with pytest.raises(PublisherDiedError, match=f"pid {pid}"):
            await pull(manifest, into=into)
        for name, t in into.items():
            assert bool((t == 5.0).all()), f"{name} changed"
    finally:
        await doomed.stop()
