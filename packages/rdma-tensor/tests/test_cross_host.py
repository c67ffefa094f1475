"""The cross-machine path, for real, between two Monarch hosts on this computer.

`monarch.job.ProcessJob({"a": 1, "b": 1})` starts two local hosts (worker processes that
Monarch drives like remote machines). Processes on host b declare a machine of their own
(`RDMA_TENSOR_MACHINE_ID`, through the bootstrap command that spawns them), so that every
read between them and host a takes the path it would take between two computers: Monarch
`RDMABuffer` (over its TCP fallback here). Processes spawned on host b without the variable
are on host a's machine, and get shared memory. Same owner, same bytes, both paths."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch
from monarch.actor import ProcMesh, default_bootstrap_cmd
from monarch.job import ProcessJob
from rdma_tensor import PublisherConfig, Transport
from rdma_tensor.machine import machine_env
from sync_actors import Generator, Owner, Reader, Trainer, matches

# Several processes, seconds each: not in `nox -s fast`.
pytestmark = pytest.mark.slow

BUCKETS = PublisherConfig(bucket_bytes=32 << 10)  # several buckets for the test state


@dataclass(frozen=True)
class Hosts:
    """Processes on two Monarch hosts: `a` (publishers, owners), `b_remote` (on host b,
    declaring machine "host-b") and `b_local` (on host b, no declaration: host a's machine)."""

    a: ProcMesh
    b_remote: ProcMesh
    b_local: ProcMesh


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    job = ProcessJob({"a": 1, "b": 1})
    state = job.state(cached_path=None)
    try:
        remote = default_bootstrap_cmd().with_env(machine_env("host-b"))
        hosts = Hosts(
            a=state.a.spawn_procs(name="on_a"),
            b_remote=state.b.spawn_procs(name="on_b_remote", bootstrap_command=remote),
            b_local=state.b.spawn_procs(name="on_b_local"),
        )
        yield hosts
        for procs in (hosts.a, hosts.b_remote, hosts.b_local):
            procs.stop().get()
    finally:
        job.kill()  # type: ignore[no-untyped-call]  # Monarch's job API is untyped


async def test_the_two_hosts_are_distinct_hosts_with_the_declared_machines(hosts: Hosts) -> None:
    """Guards the setup itself: three processes, two hosts, the variable only where set."""
    a = await hosts.a.spawn("whoami_a", Reader).whoami.call_one()
    remote = await hosts.b_remote.spawn("whoami_r", Reader).whoami.call_one()
    local = await hosts.b_local.spawn("whoami_l", Reader).whoami.call_one()
    assert a.host != remote.host  # two hosts (their worker processes)...
    assert remote.host == local.host  # ...and both meshes on b run under the same one
    assert (a.machine_id, remote.machine_id, local.machine_id) == ("", "host-b", "")


async def test_a_handle_is_read_over_rdma_from_the_declared_machine_only(hosts: Hosts) -> None:
    data = torch.randn(3, 1000, generator=torch.Generator().manual_seed(1))
    handle = await hosts.a.spawn("owner", Owner).share.call_one(data, None)
    dst = torch.zeros(3000)
    got, transport = await hosts.b_remote.spawn("reader_r", Reader).read.call_one(
        handle, dst, 0, None
    )
    assert transport is Transport.RDMA
    assert torch.equal(got, data.reshape(-1))
    got, transport = await hosts.b_local.spawn("reader_l", Reader).read.call_one(
        handle, dst, 0, None
    )
    assert transport is Transport.SHM
    assert torch.equal(got, data.reshape(-1))


async def test_shared_memory_cannot_be_forced_across_machines(hosts: Hosts) -> None:
    handle = await hosts.a.spawn("owner_shm", Owner).share.call_one(torch.ones(16), None)
    reader = hosts.b_remote.spawn("reader_shm", Reader)
    message = await reader.read_error_forced.call_one(handle, torch.zeros(16), Transport.SHM)
    assert message.startswith("TransportError: shm needs the owner's machine")
    assert "'host-b'" in message


async def test_weight_sync_crosses_machines_over_rdma_and_maps_on_one(hosts: Hosts) -> None:
    trainer = hosts.a.spawn("trainer", Trainer, BUCKETS)
    remote = hosts.b_remote.spawn("generator_r", Generator, module=True)
    local = hosts.b_local.spawn("generator_l", Generator, module=True)
    for version in (1, 2):
        manifest = await trainer.publish.call_one(version)
        assert len(manifest.bucket_layout.bucket_nbytes) > 1
        far = await remote.try_pull.call_one(manifest)
        assert far.result is not None, far.message
        assert far.result.transport is Transport.RDMA
        assert not far.result.mapped
        assert far.result.adopted  # mode "auto": runs on the buffer the version arrived in
        assert far.result.changed
        assert far.result.nbytes == manifest.nbytes
        assert await remote.holds.call_one(version)  # bit for bit
        near = await local.try_pull.call_one(manifest)
        assert near.result is not None, near.message
        assert near.result.transport is Transport.SHM
        assert near.result.mapped
        assert await local.holds.call_one(version)
    got = await remote.state_dict.call_one()
    assert matches(got, 2)


async def test_map_mode_is_refused_across_machines(hosts: Hosts) -> None:
    trainer = hosts.a.spawn("trainer_map", Trainer, BUCKETS)
    remote = hosts.b_remote.spawn("generator_map", Generator, module=True, mode="map")
    outcome = await remote.try_pull.call_one(await trainer.publish.call_one(1))
    assert outcome.error == "TransportError"
    assert "mode='map' needs the publisher's machine" in outcome.message
    assert not await remote.holds.call_one(1)
