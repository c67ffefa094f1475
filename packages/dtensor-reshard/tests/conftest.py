"""Shared fixtures. `torch_shards`: what torch.distributed.tensor itself puts on every rank.

`LocalTensorMode` (torch's single-process SPMD simulator) runs the real `distribute_tensor`
for every rank of a mesh over a fake process group, so tests compare the planner against
torch's own sharding code rather than a re-implementation of its rules.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from math import prod

import monarch.actor
import pytest
import torch
import torch.distributed as dist
from dtensor_reshard import Layout
from torch.distributed._local_tensor import LocalTensor, LocalTensorMode
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import distribute_tensor
from torch.testing._internal.distributed.fake_pg import FakeStore

# The test actors live in `reshard_actors.py` beside this file (pickled by value to the
# spawned processes, which cannot import this directory).
sys.path.insert(0, os.path.dirname(__file__))
# Every process is on this machine unless a test declares otherwise (test_cross_host.py): a
# developer's RDMA_TENSOR_MACHINE_ID must not leak in (removed before anything fixes this
# process's identity, see rdma_tensor.machine, and before any process is spawned).
os.environ.pop("RDMA_TENSOR_MACHINE_ID", None)

WORLD_SIZE = 16
CLEANUP_OVERRAN = "cleanup error: deadline has elapsed"
# A SIGKILLed process is reported either as killed or, when Monarch's poll asks its dead
# process's agent first, as a query left unanswered ("... The process likely crashed").
KILLED_UNANSWERED = "The process likely crashed"


@pytest.fixture(autouse=True)
def _no_forced_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests choose transports explicitly; a developer's RDMA_TENSOR_TRANSPORT must not leak."""
    monkeypatch.delenv("RDMA_TENSOR_TRANSPORT", raising=False)


@pytest.fixture(scope="session", autouse=True)
def _tolerate_deliberate_kills() -> None:
    """Monarch reports a SIGKILLed process to the controller seconds later, possibly after the
    test that killed it, even after the last test; the default hook would then exit pytest
    with an error (by raising KeyboardInterrupt in the main thread, which crashes an xdist
    worker). Kills are deliberate here (test_killed_source.py). So are stops: on a busy
    machine a mesh being stopped can pass Monarch's 3 s cleanup deadline ("cleanup error:
    deadline has elapsed"; seen twice in three `-n 2` runs). Any other failure still goes to
    the default hook. Never restored: the report can outlive the session's teardown."""
    default = monarch.actor.unhandled_fault_hook
    expected = ("Killed(sig=9)", KILLED_UNANSWERED, CLEANUP_OVERRAN)

    def hook(failure: monarch.actor.MeshFailure) -> None:
        if not any(m in str(failure) for m in expected):
            default(failure)

    monarch.actor.unhandled_fault_hook = hook


TorchShards = Callable[[Layout, torch.Tensor], list[torch.Tensor]]


@pytest.fixture(scope="module")
def torch_shards() -> Iterator[TorchShards]:
    """A fake default process group (no communication) big enough for every test mesh,
    and a function giving torch's local shards under it."""
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD_SIZE)
    try:
        yield _torch_local_shards
    finally:
        dist.destroy_process_group()


def _torch_local_shards(layout: Layout, full: torch.Tensor) -> list[torch.Tensor]:
    """`distribute_tensor(full, mesh, placements)`'s local tensor on each mesh rank."""
    n = prod(layout.mesh_shape)
    with LocalTensorMode(frozenset(range(n))):
        mesh = DeviceMesh("cpu", torch.arange(n).reshape(layout.mesh_shape))
        dtensor = distribute_tensor(full, mesh, list(layout.placements))
        local = dtensor._local_tensor
    if isinstance(local, LocalTensor):
        return [local._local_tensors[r].clone() for r in range(n)]
    # Every rank holds the same tensor (e.g. all-Replicate): torch does not wrap it.
    return [local.clone() for _ in range(n)]
