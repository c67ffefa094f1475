"""The source side of a transfer: `ShardPublisher` shares one source rank's pieces.

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
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping

import torch
from rdma_tensor import SharedTensor, TensorHandle, Transport, share
from rdma_tensor.lowlevel import transport_override

from dtensor_reshard.errors import ReshardError
from dtensor_reshard.exports import LOCAL_SOURCES, SourceExport, local_shards
from dtensor_reshard.reshard_plan import ReshardPlan

# (dtype, destination ranks reading it, the shared buffer): see ReshardPlan.buffer_groups.
_Buffers = list[tuple[torch.dtype, tuple[int, ...], SharedTensor]]


def _identity(t: torch.Tensor) -> tuple[object, ...]:
    return (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t.device)


class ShardPublisher:
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
        self._free: tuple[str, list[_Buffers]] = ("", [])
        self._live: dict[str, tuple[str, _Buffers]] = {}

    def publish(self, plan: ReshardPlan, tensors: Mapping[str, torch.Tensor]) -> SourceExport:
        """Shares this rank's pieces of `tensors` (DTensors or local shards) for `plan`.

        Raises `ReshardError`, before anything is shared or staged, when the rank is outside
        the source mesh, a tensor is missing or extra, or one has the wrong local shape,
        dtype or (direct mode) is not contiguous.
        """
        local = local_shards(plan, self.src_rank, tensors, "source")
        token = uuid.uuid4().hex
        if self.staged:
            buffers = self._stage(plan, local)
            self._live[token] = (plan.fingerprint, buffers)
            export = SourceExport(
                self.src_rank,
                plan.fingerprint,
                shards=(),
                buffers=tuple((d, dtype, s.handle) for dtype, ds, s in buffers for d in ds),
                token=token,
            )
        else:
            export = SourceExport(
                self.src_rank, plan.fingerprint, self._share_shards(plan, local), (), token
            )
            self._live[token] = (plan.fingerprint, [])
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

    def _stage(self, plan: ReshardPlan, local: dict[str, torch.Tensor]) -> _Buffers:
        fingerprint, free = self._free
        if fingerprint != plan.fingerprint:  # layouts changed: the old buffers fit no more
            for buffers in free:
                _close(buffers)
            self._free = (plan.fingerprint, [])
        buffers = self._free[1].pop() if self._free[1] else self._allocate(plan, local)
        with torch.no_grad():
            for dtype, dst_ranks, shared in buffers:
                flat = shared.tensor
                for slot in plan.slots(self.src_rank, dst_ranks[0], dtype):
                    box = slot.piece.src_box
                    target = flat[slot.offset : slot.offset + box.numel].view(box.sizes)
                    target.copy_(box.view(local[slot.name]))
        return buffers

    def _allocate(self, plan: ReshardPlan, local: dict[str, torch.Tensor]) -> _Buffers:
        device = next(iter(local.values())).device
        buffers: _Buffers = []
        try:
            for dtype, dst_ranks in plan.buffer_groups(self.src_rank):
                numel = plan.buffer_numel(self.src_rank, dst_ranks[0], dtype)
                staging = torch.empty(numel, dtype=dtype, device=device)
                buffers.append((dtype, dst_ranks, share(staging, transport=self._transport)))
        except BaseException:
            _close(buffers)
            raise
        return buffers

    def release(self, export: SourceExport | None = None) -> None:
        """Ends one export (every export when None): its destinations have pulled. Staging
        buffers go back to the pool for the next version; shared shards stay shared."""
        tokens = list(self._live) if export is None else [export.token]
        for token in tokens:
            fingerprint, buffers = self._live.pop(token, ("", []))
            LOCAL_SOURCES.pop(token, None)
            if buffers and fingerprint == self._free[0]:
                self._free[1].append(buffers)
            else:
                _close(buffers)

    def close(self) -> None:
        """Frees everything this publisher shared; outstanding exports become unreadable."""
        self.release()
        for buffers in self._free[1]:
            _close(buffers)
        self._free = ("", [])
        for _, shared in self._shards.values():
            shared.close()
        self._shards.clear()


def _close(buffers: _Buffers) -> None:
    for _, _, shared in buffers:
        shared.close()
