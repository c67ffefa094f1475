"""The destination side of a plan-based transfer: `pull_plan` fills one destination rank's
local shards straight from the sources' exports."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence

import torch
from rdma_tensor import StaleVersionError, TensorHandle, Transport, TransportError
from rdma_tensor.lowlevel import check_owner, choose_transport, local_tensor
from rdma_tensor.machine import this_machine

from dtensor_reshard.errors import ReshardError
from dtensor_reshard.exports import LOCAL_SOURCES, PullStats, SourceExport, local_shards
from dtensor_reshard.reshard_plan import ReshardPlan, Slot

_Copy = tuple[torch.Tensor, torch.Tensor]  # (destination view, source view)


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
                f"source rank {e.src_rank} published by plan {e.fingerprint}, but this "
                f"destination holds plan {plan.fingerprint}: the two sides disagree on a layout"
            )
        missing: list[object]
        if e.staged:
            have = {(d, dtype) for d, dtype, _ in e.buffers}
            missing = [k for k in plan.buffers(e.src_rank) if k[0] == dst_rank and k not in have]
        else:
            names = {n for n, _ in e.shards}
            missing = [n for n in plan.names if n not in names and _reads(plan, dst_rank, e, n)]
        if missing:
            raise ReshardError(f"source rank {e.src_rank}'s export lacks {missing}")
    return by_rank


def _reads(plan: ReshardPlan, dst_rank: int, export: SourceExport, name: str) -> bool:
    return any(p.src_rank == export.src_rank and not p.local for p in plan[name].pieces[dst_rank])


def _mapped(handle: TensorHandle, src_rank: int) -> tuple[torch.Tensor, Transport]:
    """A same-machine source shard as a flat tensor of this process (no copy), and the
    transport that maps it."""
    refused = (
        f"source rank {src_rank} shared its shards in place (direct mode), which only "
        "destinations on its machine can read, and this one is not"
    )
    hint = "publish with PlanPublisher(staged=True) to serve other machines"
    try:
        transport = choose_transport(handle)
    except TransportError as e:  # shared for shm or cuda_ipc only, and not on this machine
        raise ReshardError(f"{refused}: {e}; {hint}") from e
    if transport is Transport.RDMA:
        source, here = handle.owner.process.machine, this_machine()
        raise ReshardError(f"{refused}: the source is on {source}, this process on {here}; {hint}")
    check_owner(handle.owner)
    return local_tensor(handle, transport), transport


def _run(copies: list[_Copy]) -> None:
    with torch.no_grad():
        for dst, src in copies:
            dst.copy_(src)
    if any(d.is_cuda or s.is_cuda for d, s in copies):
        torch.cuda.synchronize()


async def _check_stamps(exports: Sequence[SourceExport]) -> None:
    """Raises `StaleVersionError` if any staged export's buffers no longer hold its data."""

    async def read(export: SourceExport) -> tuple[SourceExport, int, int]:
        assert export.stamp is not None
        handle, want = export.stamp
        got = torch.empty(1, dtype=torch.int64)
        await handle.read_into(got)
        return export, want, int(got.item())

    for export, want, got in await asyncio.gather(*(read(e) for e in exports)):
        if got != want:
            now = "are being packed again" if got < 0 else "hold a later publish"
            raise StaleVersionError(
                f"source rank {export.src_rank}'s staging buffers for this export {now}: it "
                "was released before this pull finished; pull the newer export instead"
            )


async def _read_buffer(
    handle: TensorHandle, slots: tuple[Slot, ...], out: dict[str, torch.Tensor]
) -> tuple[int, Transport]:
    """Reads one whole staging buffer into the destination boxes it feeds; returns the bytes
    read and the transport that carried them (`choose_transport`: the same decision for
    every pair of processes as rdma-tensor's own pulls)."""
    transport = choose_transport(handle)
    if len(slots) == 1 or transport is not Transport.RDMA:
        # One piece, or a same-machine buffer (any slice of it is one memory copy): each
        # piece straight into its (possibly strided) destination view, no bounce buffer.
        nbytes = 0
        for slot in slots:
            dst = slot.piece.dst_box.view(out[slot.name])
            nbytes += (await handle.read_into(dst, offset=slot.offset, transport=transport)).nbytes
        return nbytes, transport
    # RDMABuffer reads whole buffers only: one read into scratch memory, then the pieces.
    some = out[slots[0].name]
    buffer = torch.empty(handle.numel, dtype=some.dtype, device=some.device)
    result = await handle.read_into(buffer, transport=transport)
    with torch.no_grad():
        for slot in slots:
            box = slot.piece.dst_box
            box.view(out[slot.name]).copy_(
                buffer[slot.offset : slot.offset + box.numel].view(box.sizes)
            )
    return result.nbytes, result.transport


async def pull_plan(
    plan: ReshardPlan,
    dst_rank: int,
    exports: Sequence[SourceExport],
    tensors: Mapping[str, torch.Tensor],
) -> PullStats:
    """Fills destination rank `dst_rank`'s local shards of `tensors` (DTensors or local
    tensors, written in place) from every source rank's export.

    Checks first, then moves bytes: the rank, names, shapes, dtypes, one export per source
    rank, matching plan fingerprints, live co-located sources and reachable shards all raise
    `ReshardError` (or rdma-tensor's transport errors) before any destination byte changes.
    Direct exports: boxes are copied straight from the mapped source shards (in a worker
    thread, so the actor's event loop stays free). Staged exports: whole buffers are read
    concurrently across source ranks, and each source's stamp is read before and after; an
    export released (`PlanPublisher.release`) and re-packed before the reads began raises
    `StaleVersionError` before any write, one re-packed during the reads raises it after.
    If a source dies or is re-packed mid-pull, this rank's shards are partly updated: pull
    again from a fresh publish before using them (`dtensor_reshard.pull` stages instead, so
    its destination is never partly updated).
    """
    began = time.perf_counter()
    out = local_shards(plan, dst_rank, tensors, "destination")
    by_rank = _check_exports(plan, dst_rank, exports)

    local_copies: list[_Copy] = []
    remote_copies: list[_Copy] = []
    mapped: dict[tuple[int, str], torch.Tensor] = {}
    transports: set[Transport] = set()
    for name, p in plan.plans:
        for piece in p.pieces[dst_rank]:
            export = by_rank[piece.src_rank]
            if piece.local:
                source = LOCAL_SOURCES.get(export.token, {}).get(name)
                if source is None:
                    raise ReshardError(
                        f"tensor {name!r}: co-located source rank {piece.src_rank} has no live "
                        "export in this process (released already, or not co-located?)"
                    )
            elif not export.staged:
                key = (piece.src_rank, name)
                if key not in mapped:
                    handle = dict(export.shards)[name]
                    mapped[key], transport = _mapped(handle, piece.src_rank)
                    transports.add(transport)
                source = mapped[key].view(p.src.local_shape(piece.src_rank))
            else:
                continue
            copy = (piece.dst_box.view(out[name]), piece.src_box.view(source))
            (local_copies if piece.local else remote_copies).append(copy)

    buffers = [
        (handle, plan.slots(src_rank, dst_rank, dtype))
        for src_rank, export in sorted(by_rank.items())
        for d, dtype, handle in export.buffers
        if d == dst_rank
    ]
    for handle, _ in buffers:
        if choose_transport(handle) is not Transport.RDMA:
            check_owner(handle.owner)  # a closed or dead same-machine source fails before writes
    stamped = [
        e
        for e in by_rank.values()
        if e.stamp is not None and any(d == dst_rank for d, _, _ in e.buffers)
    ]
    await _check_stamps(stamped)
    reads = [_read_buffer(handle, slots, out) for handle, slots in buffers]
    _, read = await asyncio.gather(
        asyncio.to_thread(_run, local_copies + remote_copies), asyncio.gather(*reads)
    )
    await _check_stamps(stamped)
    transports.update(transport for _, transport in read)
    read_bytes = sum(n for n, _ in read) + sum(
        d.numel() * d.element_size() for d, _ in remote_copies
    )
    local_bytes = sum(d.numel() * d.element_size() for d, _ in local_copies)
    issued = len(reads) + len(remote_copies)
    seconds = time.perf_counter() - began
    return PullStats(read_bytes, local_bytes, issued, seconds, frozenset(transports))
