"""The data contracts of a plan-based transfer: what a source publishes and what a pull
reports.

One version flows in three steps, driven by the controller:

    exports = await sources.publish.call()     # each source: PlanPublisher.publish(...)
    await destinations.pull.call(exports)      # each destination: await pull_plan(...)
    await sources.release.call()               # each source: PlanPublisher.release()

Only the `SourceExport`s travel through actor messages (well under a kilobyte per tensor and
source rank); where each piece sits follows from the `ReshardPlan` both sides hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from rdma_tensor import TensorHandle, Transport
from torch.distributed.tensor import DTensor

from dtensor_reshard.errors import ReshardError
from dtensor_reshard.reshard_plan import ReshardPlan

# Source shards of every live export made in this process, by export token, so that a
# destination in the same process (a co-located plan) copies its local pieces directly.
LOCAL_SOURCES: dict[str, dict[str, torch.Tensor]] = {}


@dataclass(frozen=True)
class SourceExport:
    """What one source rank publishes for one version; picklable and small.

    Exactly one of `shards` and `buffers` is non-empty (unless the rank serves nothing):

    Attributes:
        src_rank: the source mesh rank that published.
        fingerprint: `ReshardPlan.fingerprint` of the plan it published by.
        shards: direct mode: (tensor name, handle of the rank's whole local shard, flat in
            row-major order). Same-machine destinations copy their boxes straight out of it.
        buffers: staged mode: (destination rank, dtype, handle) per staging buffer; each is
            1-D and holds `ReshardPlan.slots(src_rank, destination rank, dtype)` back to back.
        token: identifies this export's source tensors inside the source's own process.
        stamp: staged mode: (handle of the buffers' one-int64 stamp, the value it holds while
            the buffers hold this export's data). A different value means the buffers were
            released and packed again (or are being packed); `pull_plan` then refuses them.
    """

    src_rank: int
    fingerprint: str
    shards: tuple[tuple[str, TensorHandle], ...]
    buffers: tuple[tuple[int, torch.dtype, TensorHandle], ...]
    token: str
    stamp: tuple[TensorHandle, int] | None = None

    @property
    def staged(self) -> bool:
        return bool(self.buffers)


@dataclass(frozen=True)
class PullStats:
    """What one destination rank's `pull_plan` did.

    Attributes:
        bytes_read: bytes copied out of other processes' memory (through handles).
        bytes_local: bytes copied from co-located sources in this process.
        reads: handle reads (staged mode) or box copies (direct mode) issued.
        seconds: wall-clock time of the pull, validation included.
        transports: the rdma-tensor transports that carried `bytes_read` (`SHM` or
            `CUDA_IPC` from sources on this machine, `RDMA` from sources on others; see
            `rdma_tensor.machine`); empty when nothing was read from another process.
    """

    bytes_read: int
    bytes_local: int
    reads: int
    seconds: float
    transports: frozenset[Transport] = frozenset()


def local_shards(
    plan: ReshardPlan, rank: int, tensors: Mapping[str, torch.Tensor], side: str
) -> dict[str, torch.Tensor]:
    """Local shards by name (`to_local()` of DTensors), checked against the plan: the rank,
    the names, each shape and dtype, and a single device. Raises `ReshardError`."""
    first = plan.plans[0][1]
    (first.src if side == "source" else first.dst).check_rank(rank, side)
    if set(tensors) != set(plan.names):
        missing = sorted(set(plan.names) - set(tensors))
        extra = sorted(set(tensors) - set(plan.names))
        raise ReshardError(
            f"{side} tensors do not match the plan: missing {missing}, extra {extra}"
        )
    out = {}
    shapes = plan.local_shapes(rank, side)
    for name, p in plan.plans:
        layout = p.src if side == "source" else p.dst
        tensor = tensors[name]
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        want = shapes[name]
        if tuple(local.shape) != want or local.dtype != layout.dtype:
            raise ReshardError(
                f"{side} tensor {name!r} on rank {rank} is {tuple(local.shape)} {local.dtype}, "
                f"but the plan expects local shape {want} {layout.dtype} ({layout.describe()})"
            )
        out[name] = local
    devices = {t.device for t in out.values()}
    if len(devices) > 1:
        raise ReshardError(f"{side} tensors are on several devices {sorted(map(str, devices))}")
    return out
