"""Moving the bytes: each source rank stages and shares its pieces once, and each
destination rank pulls exactly its pieces, through `rdma-tensor` handles, into its shards.

One version flows in three steps, driven by the controller:

    exports = await sources.publish.call()     # each source: ShardPublisher.publish(...)
    await destinations.pull.call(exports)      # each destination: await pull(...)
    await sources.release.call()               # each source: ShardPublisher.release()

The only thing that travels through actor messages is the list of `SourceExport`s (a few
hundred bytes per source rank); piece offsets come from the `ReshardPlan` both sides hold.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from rdma_tensor import SharedTensor, TensorHandle, Transport, share
from torch.distributed.tensor import DTensor

from dtensor_reshard.errors import ReshardError
from dtensor_reshard.reshard_plan import ReshardPlan, Slot

# Source tensors of every live export made in this process, by export token, so that a
# destination in the same process (a co-located plan) copies its local pieces directly.
_LOCAL_SOURCES: dict[str, dict[str, torch.Tensor]] = {}


@dataclass(frozen=True)
class SourceExport:
    """What one source rank publishes for one transfer; picklable and small.

    Attributes:
        src_rank: the source mesh rank that staged the buffers.
        fingerprint: `ReshardPlan.fingerprint` of the plan the buffers were laid out by.
        handles: (dtype, handle) for each staging buffer; each buffer is 1-D, holding the
            remote pieces of that dtype in the plan's slot order.
        token: identifies the export's source tensors inside the source's own process.
    """

    src_rank: int
    fingerprint: str
    handles: tuple[tuple[torch.dtype, TensorHandle], ...]
    token: str


@dataclass(frozen=True)
class PullStats:
    """What one destination rank's `pull` did.

    Attributes:
        bytes_read: bytes read through handles (from other processes).
        bytes_local: bytes copied from co-located sources in this process.
        reads: number of handle reads issued.
        seconds: wall-clock time of the pull, validation included.
    """

    bytes_read: int
    bytes_local: int
    reads: int
    seconds: float


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _check_tensors(
    plan: ReshardPlan, rank: int, tensors: Mapping[str, torch.Tensor], side: str
) -> dict[str, torch.Tensor]:
    """Local shards by name, checked against the plan (names, shapes, dtypes, one device)."""
    if set(tensors) != set(plan.names):
        missing = sorted(set(plan.names) - set(tensors))
        extra = sorted(set(tensors) - set(plan.names))
        raise ReshardError(
            f"{side} tensors do not match the plan: missing {missing}, extra {extra}"
        )
    out = {}
    for name, p in plan.plans:
        layout = p.src if side == "source" else p.dst
        local = _local(tensors[name])
        want = layout.local_shape(rank)
        if tuple(local.shape) != want or local.dtype != layout.dtype:
            raise ReshardError(
                f"{side} tensor {name!r} on rank {rank} is {tuple(local.shape)} "
                f"{local.dtype}, but the plan expects local shape {want} {layout.dtype} "
                f"({layout.describe()})"
            )
        out[name] = local
    devices = {t.device for t in out.values()}
    if len(devices) > 1:
        raise ReshardError(f"{side} tensors are on several devices {sorted(map(str, devices))}")
    return out


class ShardPublisher:
    """The source side, one per source rank: stages and shares that rank's pieces.

    Staging copies each remote piece once into a flat buffer per dtype (on the tensors'
    device); after `publish` returns, the source tensors may change freely, except for a
    co-located plan, whose local pieces are copied from the live tensors at `pull` time.
    """

    def __init__(self, src_rank: int, *, transport: Transport | None = None) -> None:
        self.src_rank = src_rank
        self._transport = transport
        self._live: dict[str, list[SharedTensor]] = {}

    def publish(self, plan: ReshardPlan, tensors: Mapping[str, torch.Tensor]) -> SourceExport:
        """Stages and shares this rank's pieces of `tensors` (DTensors or local shards).

        Raises `ReshardError`, before staging anything, when the rank is outside the source
        mesh or a tensor is missing, extra, or of the wrong local shape or dtype.
        """
        plan.plans[0][1].src.check_rank(self.src_rank, "source")
        local = _check_tensors(plan, self.src_rank, tensors, "source")
        device = next(iter(local.values())).device
        token = uuid.uuid4().hex
        shared: list[SharedTensor] = []
        handles = []
        try:
            for dtype in plan.dtypes(self.src_rank):
                staging = torch.empty(
                    plan.staging_numel(self.src_rank, dtype), dtype=dtype, device=device
                )
                with torch.no_grad():
                    for slot in plan.slots(self.src_rank, dtype):
                        piece = slot.piece
                        target = staging[slot.offset : slot.offset + piece.numel]
                        target.view(piece.src_box.sizes).copy_(piece.src_box.view(local[slot.name]))
                shared.append(share(staging, transport=self._transport))
                handles.append((dtype, shared[-1].handle))
        except BaseException:
            for s in shared:
                s.close()
            raise
        self._live[token] = shared
        if plan.colocated:
            _LOCAL_SOURCES[token] = local
        return SourceExport(self.src_rank, plan.fingerprint, tuple(handles), token)

    def release(self, export: SourceExport | None = None) -> None:
        """Frees one export's shared buffers, or every export's when `export` is None."""
        tokens = list(self._live) if export is None else [export.token]
        for token in tokens:
            for s in self._live.pop(token, []):
                s.close()
            _LOCAL_SOURCES.pop(token, None)


def _check_exports(
    plan: ReshardPlan, dst_rank: int, exports: Sequence[SourceExport]
) -> dict[int, SourceExport]:
    by_rank = {e.src_rank: e for e in exports}
    if len(by_rank) != len(exports) or set(by_rank) != set(range(plan.num_src_ranks)):
        ranks = sorted(e.src_rank for e in exports)
        raise ReshardError(
            f"need exactly one export per source rank 0..{plan.num_src_ranks - 1}, "
            f"got ranks {ranks}"
        )
    for e in exports:
        if e.fingerprint != plan.fingerprint:
            raise ReshardError(
                f"source rank {e.src_rank} staged by plan {e.fingerprint}, but this destination "
                f"holds plan {plan.fingerprint}: the two sides disagree on a layout"
            )
        needed = {d for d in plan.dtypes(e.src_rank) if plan.reads(e.src_rank, d, dst_rank)}
        if not needed <= {d for d, _ in e.handles}:
            raise ReshardError(f"source rank {e.src_rank}'s export lacks a buffer for {needed}")
    for name, p in plan.plans:
        for piece in p.pieces[dst_rank]:
            token = by_rank[piece.src_rank].token
            if piece.local and name not in _LOCAL_SOURCES.get(token, {}):
                raise ReshardError(
                    f"tensor {name!r}: the co-located source rank {piece.src_rank} has no live "
                    "export in this process (was it released, or is the plan not co-located?)"
                )
    return by_rank


async def _read_range(
    handle: TensorHandle, slots: tuple[Slot, ...], out: dict[str, torch.Tensor]
) -> int:
    """Reads one contiguous range of a staging buffer into the destination boxes."""
    start = slots[0].offset
    if len(slots) == 1:  # one piece: straight into the (possibly strided) destination view
        slot = slots[0]
        await handle.read_into(slot.piece.dst_box.view(out[slot.name]), offset=start)
        return slot.piece.numel * out[slot.name].element_size()
    numel = sum(s.piece.numel for s in slots)
    some = out[slots[0].name]
    buffer = torch.empty(numel, dtype=some.dtype, device=some.device)
    await handle.read_into(buffer, offset=start)
    with torch.no_grad():
        for slot in slots:
            piece = slot.piece
            chunk = buffer[slot.offset - start : slot.offset - start + piece.numel]
            piece.dst_box.view(out[slot.name]).copy_(chunk.view(piece.dst_box.sizes))
    return numel * buffer.element_size()


async def pull(
    plan: ReshardPlan,
    dst_rank: int,
    exports: Sequence[SourceExport],
    tensors: Mapping[str, torch.Tensor],
) -> PullStats:
    """Fills destination rank `dst_rank`'s local shards of `tensors` (DTensors or local
    tensors, written in place) from the sources' `exports`.

    Every check (rank, names, shapes, dtypes, one export per source rank, matching plan
    fingerprints, live co-located sources) runs before the first byte moves. Reads from
    different source ranks run concurrently; each reads one contiguous staging range.
    """
    began = time.perf_counter()
    plan.plans[0][1].dst.check_rank(dst_rank, "destination")
    out = _check_tensors(plan, dst_rank, tensors, "destination")
    by_rank = _check_exports(plan, dst_rank, exports)

    bytes_local = 0
    with torch.no_grad():
        for name, p in plan.plans:
            for piece in p.pieces[dst_rank]:
                if piece.local:
                    source = _LOCAL_SOURCES[by_rank[piece.src_rank].token][name]
                    piece.dst_box.view(out[name]).copy_(piece.src_box.view(source))
                    bytes_local += piece.numel * out[name].element_size()

    jobs = []
    for src_rank, export in sorted(by_rank.items()):
        for dtype, handle in export.handles:
            slots = plan.reads(src_rank, dtype, dst_rank)
            if slots:
                jobs.append(_read_range(handle, slots, out))
    read = await asyncio.gather(*jobs)
    return PullStats(sum(read), bytes_local, len(jobs), time.perf_counter() - began)
