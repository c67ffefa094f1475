"""Which machine a process is on: the one decision behind every same-machine transport.

Two processes are on the same machine when a reader can map the owner's memory: shared
memory and CUDA IPC then carry the bytes; otherwise RDMA does. rdma-tensor and
dtensor-reshard take that decision in one place, `same_machine(a, b)`, on the `Machine`
every handle carries for its owner (through `rdma_tensor.lowlevel.choose_transport`).

A `Machine` is a booted kernel (hostname and `/proc/sys/kernel/random/boot_id`: a hostname
alone is not unique across containers or reboots) plus an optional machine id that the
process declares itself, with the environment variable `RDMA_TENSOR_MACHINE_ID`. The
declared id only ever splits a kernel into several machines, never joins two kernels:
processes on two hosts are two machines whatever they declare (their memory cannot be mapped
across kernels). Splitting is what lets several Monarch hosts on one box (e.g.
`monarch.job.ProcessJob`) behave as separate machines, so the cross-machine path runs and
is tested on one computer. Give each host's processes their own value, e.g.

    bootstrap = default_bootstrap_cmd().with_env(machine_env("host-b"))
    procs = host_b.spawn_procs(bootstrap_command=bootstrap)

A process's identity is fixed the first time it is used (the first `share`, `publish` or
pull), so that a handle made earlier keeps naming the same machine; changing the variable
after that raises `ValueError` instead of being silently ignored.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from functools import cache

MACHINE_ID_ENV = "RDMA_TENSOR_MACHINE_ID"

_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_ID_RULE = "1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit"


@dataclass(frozen=True)
class Machine:
    """One machine as weight sync sees it.

    hostname: `socket.gethostname()`.
    boot_id: the kernel's boot id (`/proc/sys/kernel/random/boot_id`); "" where there is none
        (not Linux), then the hostname alone identifies the kernel.
    machine_id: the id the process declared with `RDMA_TENSOR_MACHINE_ID`, "" if none.
    """

    hostname: str
    boot_id: str
    machine_id: str = ""

    def __str__(self) -> str:
        declared = f", machine id {self.machine_id!r}" if self.machine_id else ""
        return f"{self.hostname!r} (boot {self.boot_id[:8] or '?'}{declared})"


def same_machine(a: Machine, b: Machine) -> bool:
    """Whether processes on `a` and `b` share memory: the same kernel (hostname and boot id)
    and the same declared machine id. Same machine: shared memory or CUDA IPC; otherwise
    RDMA."""
    return a == b


def parse_machine_id(raw: str | None) -> str:
    """The declared machine id in `raw` (a value of `RDMA_TENSOR_MACHINE_ID`): "" for unset
    or blank, else the stripped value. Raises `ValueError` naming the variable and the rule
    for anything else (spaces inside, other characters, more than 64 characters)."""
    value = (raw or "").strip()
    if value and not _ID_RE.fullmatch(value):
        raise ValueError(
            f"{MACHINE_ID_ENV}={raw!r} is not a valid machine id: use {_ID_RULE} "
            "(e.g. 'host-b'), or leave it unset for the machine's own identity"
        )
    return value


def machine_env(machine_id: str) -> dict[str, str]:
    """The environment that makes processes declare `machine_id` (checked now, not in the
    spawned process): pass it to `monarch.actor.default_bootstrap_cmd().with_env(...)` and
    that bootstrap command to `HostMesh.spawn_procs(bootstrap_command=...)`."""
    given: object = machine_id  # callers are not always type-checked
    value = parse_machine_id(given) if isinstance(given, str) else ""
    if not value:
        raise ValueError(f"machine_env needs a machine id ({_ID_RULE}), got {machine_id!r}")
    return {MACHINE_ID_ENV: value}


@cache
def _kernel() -> tuple[str, str]:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip()
    except OSError:  # not Linux-like: the hostname is all we have
        boot_id = ""
    return socket.gethostname(), boot_id


_fixed: list[Machine] = []  # this process's identity, once used (at most one element)


def this_machine() -> Machine:
    """This process's `Machine`: its kernel, plus `RDMA_TENSOR_MACHINE_ID` as read the first
    time this is called. Raises `ValueError` when the variable is malformed, or when it
    changed since (the handles this process made would otherwise name another machine)."""
    declared = parse_machine_id(os.environ.get(MACHINE_ID_ENV))
    if not _fixed:
        _fixed.append(Machine(*_kernel(), declared))
    elif declared != _fixed[0].machine_id:
        raise ValueError(
            f"{MACHINE_ID_ENV} changed from {_fixed[0].machine_id!r} to {declared!r} after "
            "this process first used its machine identity; set it before the process shares, "
            "publishes or pulls anything (in its environment or bootstrap command)"
        )
    return _fixed[0]
