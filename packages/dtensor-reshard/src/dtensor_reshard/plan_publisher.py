"""The source side of a plan-based transfer: `PlanPublisher` shares one source rank's pieces
for a given `ReshardPlan` (the versioned `ShardedPublisher` is built on it).

Two modes, both moving exactly the plan's bytes:

- direct (default on one machine): the rank's local shards themselves are shared in place
  (`rdma_tensor.share` moves a CPU tensor's storage into shared memory once; later versions
  reuse the handle). Destinations copy their boxes straight out of them: one copy per byte,
  no staging. Sources must not change until the destinations have pulled.
- staged (`staged=True`, the default when `RDMA_TENSOR_TRANSPORT=rdma`): each remote piece is
  packed into a flat buffer per (destination rank, dtype), so every destination reads whole
  buffers holding only what it needs, over any transport, RDMA across machines included.
  Destinations needing the same boxes (replicas) share one buffer, packed once. Buffers are
  snapshots (sources may change after `publish` returns) and are reused across versions.
  Each set of buffers has a one-word *stamp*: -1 while it is being packed, then a number
  never used before. An export records the number, and `pull_plan` reads the stamp before
  and after its reads, so a pull of an export whose buffers were released and packed again
  fails (`StaleVersionError`) instead of returning a mix of two versions.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from rdma_tensor import SharedTensor, TensorHandle, Transport, share
from rdma_tensor.lowlevel import transport_override

from dtensor_reshard.errors import ReshardError
from dtensor_reshard.exports import LOCAL_SOURCES, SourceExport, local_shards
from dtensor_reshard.reshard_plan import ReshardPlan


@dataclass
class _Staging:
    """One version's staging: `buffers` are (dtype, destination ranks reading it, the shared
    buffer), see `ReshardPlan.buffer_groups`; `stamp` is one int64 (see the module doc)."""

    stamp: SharedTensor
    buffers: list[tuple[torch.dtype, tuple[int, ...], SharedTensor]]

    def close(self) -> None:
        self.stamp.close()
        for _, _, shared in self.buffers:
            shared.close()


def _identity(t: torch.Tensor) -> tuple[object, ...]:
    return (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device)


class PlanPublisher:
    """Publishes source rank `src_rank`'s pieces, version after version.

    Args:
        src_rank: this process's rank in the source layouts' mesh (row-major).
        staged: pack pieces into per-destination buffers (any transport, snapshot
            semantics) instead of sharing the shards in place (same machine only). None
            means staged exactly when the transport resolves to RDMA.
        transport: forces rdma-tensor's transport (else `RDMA_TENSOR_TRANSPORT`, else auto).
    """

    def __init__(
        self, src_rank: int, *, staged: bool | None = None, transport: Transport | None = None
    ) -> None:
        resolved = transport_override(transport)
        self.src_rank = src_rank
        self.staged = resolved is Transport.RDMA if staged is None else staged
        if not self.staged and resolved is Transport.RDMA:
            raise ReshardError(
                "direct mode shares shards in place on one machine; with RDMA use staged=True"
            )
        self._transport = resolved
        self._shards: dict[str, tuple[tuple[object, ...], SharedTensor]] = {}
        self._free: tuple[str, list[_Staging]] = ("", [])
        self._live: dict[str, tuple[str, _Staging | None]] = {}
        self._stamps = itertools.count(1)

    def publish(self, plan: ReshardPlan, tensors: Mapping[str, torch.Tensor]) -> SourceExport:
        """Shares this rank's pieces of `tensors` (DTensors or local shards) for `plan`.

        Raises `ReshardError`, before anything is shared or staged, when the rank is outside
        the source mesh, a tensor is missing or extra, or one has the wrong local shape,
        dtype or (direct mode) is not contiguous.
        """
        local = local_shards(plan, self.src_rank, tensors, "source")
        token = uuid.uuid4().hex
        if self.staged:
            staging, stamp = self._stage(plan, local)
            self._live[token] = (plan.fingerprint, staging)
            export = SourceExport(
                self.src_rank,
                plan.fingerprint,
                shards=(),
                buffers=tuple((d, dtype, s.handle) for dtype, ds, s in staging.buffers for d in ds),
                token=token,
                stamp=(staging.stamp.handle, stamp),
            )
        else:
            export = SourceExport(
                self.src_rank, plan.fingerprint, self._share_shards(plan, local), (), token
            )
            self._live[token] = (plan.fingerprint, None)
        if plan.colocated:
            LOCAL_SOURCES[token] = local
        return export

    def _share_shards(
        self, plan: ReshardPlan, local: dict[str, torch.Tensor]
    ) -> tuple[tuple[str, TensorHandle], ...]:
        served = [name for name in plan.names if plan.serves(self.src_rank, name)]
        for name in served:
            if not local[name].is_contiguous():
                raise ReshardError(
                    f"direct mode shares local shards in place, and {name!r} is not "
                    "contiguous; make it contiguous or publish with staged=True"
                )
        handles = []
        for name in served:
            tensor, key = local[name], _identity(local[name])
            cached = self._shards.get(name)
            if cached is None or cached[0] != key:
                if cached is not None:
                    cached[1].close()
                kind = Transport.CUDA_IPC if tensor.is_cuda else Transport.SHM
                shared = share(tensor, transport=self._transport or kind)
                # Sharing a CPU tensor moves its storage into shared memory, so its address
                # changes: key on the new one. (The old address is free for reuse, and a new
                # tensor allocated there must not be mistaken for this one.)
                self._shards[name] = (_identity(tensor), shared)
            handles.append((name, self._shards[name][1].handle))
        return tuple(handles)

    def _stage(self, plan: ReshardPlan, local: dict[str, torch.Tensor]) -> tuple[_Staging, int]:
        """Packs this rank's pieces into a free set of buffers; returns it and its stamp."""
        fingerprint, free = self._free
        if fingerprint != plan.fingerprint:  # layouts changed: the old buffers fit no more
            for old in free:
                old.close()
            self._free = (plan.fingerprint, [])
        staging = self._free[1].pop() if self._free[1] else self._allocate(plan, local)
        stamp = staging.stamp.tensor
        stamp[0] = -1  # first: a reader of the previous contents sees that they are going
        with torch.no_grad():
            for dtype, dst_ranks, shared in staging.buffers:
                flat = shared.tensor
                for slot in plan.slots(self.src_rank, dst_ranks[0], dtype):
                    box = slot.piece.src_box
                    target = flat[slot.offset : slot.offset + box.numel].view(box.sizes)
                    target.copy_(box.view(local[slot.name]))
        if any(shared.tensor.is_cuda for _, _, shared in staging.buffers):
            torch.cuda.synchronize()  # packed for real before the stamp says so
        number = next(self._stamps)
        stamp[0] = number
        return staging, number

    def _allocate(self, plan: ReshardPlan, local: dict[str, torch.Tensor]) -> _Staging:
        device = next(iter(local.values())).device
        # The stamp lives in CPU memory whatever the buffers' device (CUDA IPC cannot carry it).
        cpu = None if self._transport is Transport.CUDA_IPC else self._transport
        staging = _Staging(share(torch.full((1,), -1), transport=cpu), [])
        try:
            for dtype, dst_ranks in plan.buffer_groups(self.src_rank):
                numel = plan.buffer_numel(self.src_rank, dst_ranks[0], dtype)
                buffer = torch.empty(numel, dtype=dtype, device=device)
                staging.buffers.append((dtype, dst_ranks, share(buffer, transport=self._transport)))
        except BaseException:
            staging.close()
            raise
        return staging

    def release(self, export: SourceExport | None = None) -> None:
        """Ends one export (every export when None): its destinations have pulled. Staging
        buffers go back to the pool for the next version; shared shards stay shared."""
        tokens = list(self._live) if export is None else [export.token]
        for token in tokens:
            fingerprint, staging = self._live.pop(token, ("", None))
            LOCAL_SOURCES.pop(token, None)
            if staging is None:
                continue
            if fingerprint == self._free[0]:
                self._free[1].append(staging)
            else:
                staging.close()

    def close(self) -> None:
        """Frees everything this publisher shared; outstanding exports become unreadable."""
        self.release()
        for staging in self._free[1]:
            staging.close()
        self._free = ("", [])
        for _, shared in self._shards.values():
            shared.close()
        self._shards.clear()
