"""Sharded weight sync across machines, for real, between two Monarch hosts on this computer.

`monarch.job.ProcessJob({"a": 1, "b": 1})` starts two local hosts. A 2-rank gloo "trainer"
publishes `Shard(0)` DTensors on host a; destinations on host b pull. Those spawned with
`RDMA_TENSOR_MACHINE_ID` set (through their bootstrap command) are another machine, so every
read takes the cross-machine path, Monarch `RDMABuffer` (over its TCP fallback here); those
spawned without it share host a's machine and read shared memory. The decision is
rdma-tensor's (`rdma_tensor.machine`), made per pair of processes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch
from dtensor_reshard import Layout, PlanCache, merge
from monarch.actor import ProcMesh, default_bootstrap_cmd
from monarch.job import ProcessJob
from monarch.spmd import setup_torch_elastic_env_async
from rdma_tensor import Transport
from rdma_tensor.machine import machine_env
from reshard_actors import (
    SENTINEL,
    PlainSource,
    PlanPuller,
    ShardedTrainerRank,
    UnshardedGenerator,
    version_weights,
)
from torch.distributed.tensor import Replicate, Shard

# Several processes, seconds each: not in `nox -s fast`.
pytestmark = pytest.mark.slow

RANKS = 2


@dataclass(frozen=True)
class Hosts:
    """`trainer`: RANKS processes on host a; on host b, `remote` declares machine "host-b"
    and `local` declares nothing (host a's machine)."""

    trainer: ProcMesh
    remote: ProcMesh
    local: ProcMesh


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    job = ProcessJob({"a": 1, "b": 1})
    state = job.state(cached_path=None)
    try:
        bootstrap = default_bootstrap_cmd().with_env(machine_env("host-b"))
        hosts = Hosts(
            trainer=state.a.spawn_procs(per_host={"procs": RANKS}, name="trainer"),
            remote=state.b.spawn_procs(name="remote", bootstrap_command=bootstrap),
            local=state.b.spawn_procs(name="local"),
        )
        yield hosts
        for procs in (hosts.trainer, hosts.remote, hosts.local):
            procs.stop().get()
    finally:
        job.kill()  # type: ignore[no-untyped-call]  # Monarch's job API is untyped


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    same = a.dtype == b.dtype and a.shape == b.shape
    return same and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


async def test_sharded_pull_reads_over_rdma_from_another_machine(hosts: Hosts) -> None:
    await setup_torch_elastic_env_async(hosts.trainer)
    trainer = hosts.trainer.spawn("trainer", ShardedTrainerRank)
    await trainer.setup.call()
    remote = hosts.remote.spawn("remote", UnshardedGenerator)
    local = hosts.local.spawn("local", UnshardedGenerator)
    assert await remote.machine_id.call_one() == "host-b"
    assert await local.machine_id.call_one() == ""
    for version in (1, 2):
        await trainer.step.call(version)
        manifest = merge(list((await trainer.publish.call(version)).values()))
        await trainer.step.call(100 + version)  # trains on: the version is a snapshot
        for generator, transport in ((remote, Transport.RDMA), (local, Transport.SHM)):
            result = await generator.update_result.call_one(manifest)
            assert result.version == version
            assert result.transports == {transport}
            assert result.bytes_read == manifest.nbytes  # each byte read once
            got = await generator.weights.call_one()
            for name, want in version_weights(version).items():
                assert bit_equal(got[name], want), (version, transport, name)
        await trainer.release.call(version)


async def test_direct_mode_is_refused_across_machines_and_staged_crosses(hosts: Hosts) -> None:
    """A plan publisher sharing its shards in place (direct mode) can serve its own machine
    only; the destination on another machine is told so, and a staged export reaches it."""
    src = {"w": Layout((6, 4), torch.float32, (1,), (Replicate(),))}
    dst = {"w": Layout((6, 4), torch.float32, (2,), (Shard(0),))}
    plan = PlanCache().get(src, dst)
    full = torch.randn(6, 4, generator=torch.Generator().manual_seed(3))
    source = hosts.trainer.slice(procs=0).spawn("plain_source", PlainSource)
    direct = await source.publish.call_one(plan, 0, {"w": full}, False)
    staged = await source.publish.call_one(plan, 0, {"w": full}, True)
    remote = hosts.remote.spawn("plan_remote", PlanPuller)
    local = hosts.local.spawn("plan_local", PlanPuller)

    refused = await remote.pull.call_one(plan, 1, [direct], "w")
    assert refused.error.startswith("ReshardError: source rank 0 shared its shards in place")
    assert "only destinations on its machine can read, and this one is not" in refused.error
    assert "machine id 'host-b'" in refused.error  # names the machines it compared
    assert bool((refused.shard == SENTINEL).all())  # refused before any write

    for puller, export, transport in (
        (local, direct, Transport.SHM),
        (local, staged, Transport.SHM),
        (remote, staged, Transport.RDMA),
    ):
        outcome = await puller.pull.call_one(plan, 1, [export], "w")
        assert outcome.stats is not None, outcome.error
        assert outcome.stats.transports == {transport}
        assert torch.equal(outcome.shard, full[3:])
