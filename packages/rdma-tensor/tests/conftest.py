"""Test setup shared by every test module.

Monarch polls for dead processes; the period is read when `monarch` is first imported
(default 10 s). The tests shorten it so that a killed process is noticed quickly. Our own
dead-publisher detection does not depend on it (it checks /proc directly).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import monarch.actor
import pytest
from monarch.actor import MeshFailure, ProcMesh, this_host

os.environ.setdefault("HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY", "1s")
# Every process is on this machine unless a test declares otherwise (test_cross_host.py): a
# developer's RDMA_TENSOR_MACHINE_ID must not leak in. Removed before anything fixes this
# process's identity (see rdma_tensor.machine), and so before any process is spawned.
os.environ.pop("RDMA_TENSOR_MACHINE_ID", None)

# The test actors live in `sync_actors.py` beside this file (pickled by value to the spawned
# processes, which cannot import this directory).
sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def _no_forced_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests choose transports explicitly; a developer's RDMA_TENSOR_TRANSPORT must not leak in."""
    monkeypatch.delenv("RDMA_TENSOR_TRANSPORT", raising=False)


@pytest.fixture(scope="session")
def procs() -> Iterator[ProcMesh]:
    """Four Monarch processes shared by every test (starting a process imports torch, which
    takes seconds on a busy machine; actors are cheap). Tests slice them: process 0 owns or
    publishes, processes 1-3 read."""
    procs = this_host().spawn_procs(per_host={"procs": 4})
    yield procs
    procs.stop().get()


CLEANUP_OVERRAN = "cleanup error: deadline has elapsed"
# A SIGKILLed process is reported either as killed or, when Monarch's poll asks its dead
# process's agent first, as a query left unanswered ("... The process likely crashed").
KILLED_UNANSWERED = "The process likely crashed"


@pytest.fixture(scope="session", autouse=True)
def _tolerate_deliberate_kills() -> None:
    """Monarch reports a SIGKILLed process to the controller seconds later, possibly after
    the test that killed it; the default hook would then exit pytest (by raising
    KeyboardInterrupt in the main thread). Kills are deliberate here (test_killed_publisher),
    and so are stops, which on a busy machine can pass Monarch's 3 s cleanup deadline
    ("cleanup error: deadline has elapsed"); any other failure still goes to the default
    hook."""
    default = monarch.actor.unhandled_fault_hook
    expected = ("Killed(sig=9)", KILLED_UNANSWERED, CLEANUP_OVERRAN)

    def hook(failure: MeshFailure) -> None:
        if not any(m in str(failure) for m in expected):
            default(failure)

    monarch.actor.unhandled_fault_hook = hook
