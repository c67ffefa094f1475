"""Which transport moves the bytes, and how a caller forces one.

The transport is chosen per pair of endpoints: a reader on the owner's machine maps the memory
directly (POSIX shared memory for CPU tensors, CUDA IPC for CUDA tensors); a reader on another
machine goes through Monarch's `RDMABuffer` (ibverbs when present, Monarch's TCP fallback
otherwise). Tests and benchmarks force one with an argument or the `RDMA_TENSOR_TRANSPORT`
environment variable (`shm`, `cuda_ipc`, `rdma`; empty or `auto` means choose).
"""

from __future__ import annotations

import enum
import os

ENV_VAR = "RDMA_TENSOR_TRANSPORT"


class Transport(enum.Enum):
    """How bytes travel from the owner's memory to the reader's."""

    SHM = "shm"
    """Same machine, CPU memory: the reader maps the owner's shared-memory file."""
    CUDA_IPC = "cuda_ipc"
    """Same machine, CUDA memory: the reader opens the owner's allocation by IPC handle."""
    RDMA = "rdma"
    """Any machine: Monarch `RDMABuffer` (ibverbs, or TCP where there is none)."""


def transport_override(
    explicit: Transport | None = None, *, device: str | None = None
) -> Transport | None:
    """The forced transport: `explicit` if given, else the environment variable, else None.

    The variable is process-wide, so for memory on `device` ("cpu", "cuda:0", ...) it is
    ignored where it cannot apply (`cuda_ipc` for CPU memory, `shm` for CUDA memory); an
    explicit argument never is. Raises `ValueError` naming the valid values when the variable
    holds anything else.
    """
    if explicit is not None:
        if not isinstance(explicit, Transport):
            raise TypeError(f"transport must be a Transport, got {explicit!r}")
        return explicit
    raw = os.environ.get(ENV_VAR, "").strip().lower()
    if raw in ("", "auto"):
        return None
    try:
        forced = Transport(raw)
    except ValueError:
        valid = ", ".join(t.value for t in Transport)
        raise ValueError(f"{ENV_VAR}={raw!r} is not one of: auto, {valid}") from None
    if device is not None:
        cuda = device.startswith("cuda")
        if (forced is Transport.CUDA_IPC and not cuda) or (forced is Transport.SHM and cuda):
            return None
    return forced
