"""Telling an open, a closed and a dead owner apart, with a real second process."""

from __future__ import annotations

import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from rdma_tensor._owner import Control, OwnerState, is_local, owner_state
from rdma_tensor.machine import this_machine

CHILD = """
import pickle, sys
from rdma_tensor._owner import Control
control = Control()
sys.stdout.write(pickle.dumps(control.owner).hex() + "\\n"); sys.stdout.flush()
for line in sys.stdin:
    control.close()
    sys.stdout.write("closed\\n"); sys.stdout.flush()
"""


@pytest.fixture
def child() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    yield proc
    proc.kill()
    proc.wait()


def test_this_process() -> None:
    control = Control()
    assert is_local(control.owner.process)
    assert owner_state(control.owner) is OwnerState.OPEN
    control.close()
    assert owner_state(control.owner) is OwnerState.CLOSED
    assert this_machine().boot_id  # Linux: the boot id is part of the machine identity


def test_closed_owner_in_another_process(child: subprocess.Popen[str]) -> None:
    assert child.stdin is not None
    assert child.stdout is not None
    owner = pickle.loads(bytes.fromhex(child.stdout.readline()))
    assert owner_state(owner) is OwnerState.OPEN
    child.stdin.write("close\n")
    child.stdin.flush()
    assert child.stdout.readline() == "closed\n"
    assert owner_state(owner) is OwnerState.CLOSED


def test_killed_owner_is_dead_even_while_it_is_still_exiting(child: subprocess.Popen[str]) -> None:
    assert child.stdout is not None
    owner = pickle.loads(bytes.fromhex(child.stdout.readline()))
    assert owner_state(owner) is OwnerState.OPEN
    child.send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 10
    while owner_state(owner) is OwnerState.OPEN and time.monotonic() < deadline:
        pass
    assert owner_state(owner) is OwnerState.DEAD
