""" "Same machine": the one decision that picks shared memory or RDMA for a pair of processes,
and `RDMA_TENSOR_MACHINE_ID`, which lets a process declare a machine of its own.

The pure parts are tested here; the variable read at startup is tested in fresh Python
processes (a process fixes its identity on first use); the cross-host path between two
Monarch hosts is in `test_cross_host.py`."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import torch
from rdma_tensor import Transport, TransportError, share
from rdma_tensor._owner import ProcessRef, is_local, this_process
from rdma_tensor.lowlevel import choose_transport
from rdma_tensor.machine import (
    MACHINE_ID_ENV,
    Machine,
    machine_env,
    parse_machine_id,
    same_machine,
    this_machine,
)


def test_same_kernel_and_no_declared_id_is_one_machine() -> None:
    assert same_machine(Machine("node1", "boot-a"), Machine("node1", "boot-a"))
    assert same_machine(Machine("node1", "boot-a", "x"), Machine("node1", "boot-a", "x"))


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (Machine("node1", "boot-a"), Machine("node2", "boot-a")),  # another host
        (Machine("node1", "boot-a"), Machine("node1", "boot-b")),  # a container elsewhere, a reboot
        (Machine("node1", "boot-a", "host-a"), Machine("node1", "boot-a", "host-b")),  # declared
        (Machine("node1", "boot-a"), Machine("node1", "boot-a", "host-b")),  # only one declares
        # A declared id only splits a kernel: two kernels stay two machines whatever they say.
        (Machine("node1", "boot-a", "same"), Machine("node2", "boot-b", "same")),
    ],
)
def test_different_machines(a: Machine, b: Machine) -> None:
    assert not same_machine(a, b)
    assert not same_machine(b, a)


@pytest.mark.parametrize(
    ("raw", "want"), [(None, ""), ("", ""), ("  ", ""), (" host-b ", "host-b")]
)
def test_machine_id_unset_blank_and_stripped(raw: str | None, want: str) -> None:
    assert parse_machine_id(raw) == want


@pytest.mark.parametrize("raw", ["host b", "-host", ".x", "a/b", "hôte", "x" * 65, "a\nb"])
def test_malformed_machine_id_names_the_variable_and_the_rule(raw: str) -> None:
    with pytest.raises(ValueError, match=MACHINE_ID_ENV) as info:
        parse_machine_id(raw)
    assert "1 to 64 letters, digits" in str(info.value)
    assert repr(raw) in str(info.value)


def test_longest_valid_machine_id() -> None:
    assert parse_machine_id("a" + "b" * 63) == "a" + "b" * 63


def test_machine_env_is_checked_before_any_process_starts() -> None:
    assert machine_env(" host-b ") == {MACHINE_ID_ENV: "host-b"}
    for bad in ("", "  ", "host b"):
        with pytest.raises(ValueError, match="machine id"):
            machine_env(bad)
    with pytest.raises(ValueError, match="machine id"):
        machine_env(7)  # type: ignore[arg-type]


def test_this_process_is_on_this_machine() -> None:
    me = this_process()
    assert me.machine == this_machine()
    assert is_local(me)
    assert this_machine().boot_id  # Linux: the kernel is part of the identity


def test_an_owner_that_declared_another_machine_is_read_over_rdma_only() -> None:
    """The owner's handle says it is on another machine (same kernel, another declared id):
    a reader here must not map its memory, whatever it asks for."""
    shared = share(torch.arange(8.0), transport=Transport.SHM)  # shm only: no RDMA buffer
    here = shared.handle
    assert choose_transport(here) is Transport.SHM
    other = dataclasses.replace(this_machine(), machine_id="elsewhere")
    process = ProcessRef(other, here.owner.process.pid, here.owner.process.start_ticks)
    away = dataclasses.replace(here, owner=dataclasses.replace(here.owner, process=process))
    assert not is_local(away.owner.process)
    with pytest.raises(TransportError, match=r"needs the owner's machine.*'elsewhere'"):
        choose_transport(away)  # the owner forced shm, which cannot cross machines
    unforced = dataclasses.replace(away, forced=None)
    with pytest.raises(TransportError, match=r"not on this machine.*no RDMA buffer"):
        choose_transport(unforced)
    with pytest.raises(TransportError, match="needs the owner's machine"):
        choose_transport(unforced, Transport.SHM)
    shared.close()


def _run(code: str, machine_id: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != MACHINE_ID_ENV}
    if machine_id is not None:
        env[MACHINE_ID_ENV] = machine_id
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.slow  # a Python process of its own
def test_the_variable_declares_the_process_machine() -> None:
    code = "from rdma_tensor.machine import this_machine; print(this_machine().machine_id)"
    assert _run(code, " host-b ").stdout == "host-b\n"
    assert _run(code, None).stdout == "\n"


@pytest.mark.slow  # a Python process of its own
def test_a_malformed_variable_fails_on_first_use() -> None:
    code = "from rdma_tensor import share; import torch; share(torch.zeros(4))"
    run = _run(code, "host b")
    assert run.returncode != 0
    assert f"ValueError: {MACHINE_ID_ENV}='host b' is not a valid machine id" in run.stderr


@pytest.mark.slow  # a Python process of its own
def test_changing_the_variable_after_first_use_is_refused() -> None:
    code = """
import os
from rdma_tensor.machine import this_machine
first = this_machine()
os.environ["RDMA_TENSOR_MACHINE_ID"] = "host-c"
try:
    this_machine()
except ValueError as e:
    print("refused:", e)
os.environ["RDMA_TENSOR_MACHINE_ID"] = "host-a"
print(this_machine() == first)
"""
    run = _run(code, "host-a")
    assert run.returncode == 0, run.stderr
    refused, same = run.stdout.splitlines()
    assert refused.startswith(f"refused: {MACHINE_ID_ENV} changed from 'host-a' to 'host-c'")
    assert same == "True"
