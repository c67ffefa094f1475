"""Test setup shared by every test module.

Monarch polls for dead processes; the period is read when `monarch` is first imported
(default 10 s). The tests shorten it so that a killed process is noticed quickly. Our own
dead-publisher detection does not depend on it (it checks /proc directly).
"""

from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY", "1s")

# The test actors live in `sync_actors.py` beside this file (pickled by value to the spawned
# processes, which cannot import this directory).
sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def _no_forced_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests choose transports explicitly; a developer's RDMA_TENSOR_TRANSPORT must not leak in."""
    monkeypatch.delenv("RDMA_TENSOR_TRANSPORT", raising=False)
