"""`ReshardPlan`: the plans for a set of named tensors (a state dict) between two meshes.

Both sides build the same `ReshardPlan` from the same layouts (plans are deterministic), so
they agree without messages on where every piece sits in a source's staging buffers: one
flat buffer per (source rank, destination rank, dtype), pieces back to back in tensor-name
order. A destination reads each of its buffers whole, so a transport that can only read
whole buffers (Monarch's `RDMABuffer`) still moves no byte another destination needs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from dtensor_reshard.box import Box
from dtensor_reshard.errors import ReshardError
from dtensor_reshard.layout import Layout
from dtensor_reshard.planner import Piece, TransferPlan, plan


@dataclass(frozen=True)
class Slot:
    """One remote piece's place in a staging buffer.

    Attributes:
        name: the tensor it belongs to.
        dst_rank: the destination rank that reads it.
        piece: the piece (boxes in source- and destination-local coordinates).
        offset: element offset in the staging buffer for (source, `dst_rank`, dtype).
    """

    name: str
    dst_rank: int
    piece: Piece
    offset: int


@dataclass(frozen=True)
class ReshardPlan:
    """Plans for named tensors that all move from one source mesh to one destination mesh.

    Attributes:
        plans: (name, plan) pairs sorted by name; every plan has the same source and
            destination rank counts.
        colocated: whether the plans were made with `colocated=True`.
    """

    plans: tuple[tuple[str, TransferPlan], ...]
    colocated: bool = False
    _slots: dict[tuple[int, int, torch.dtype], tuple[Slot, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    # Derived once (a plan is reused version after version): by name, the digest, and the
    # local shapes per (rank, side).
    _by_name: dict[str, TransferPlan] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _digest: list[str] = field(default_factory=list, init=False, repr=False, compare=False)
    _shapes: dict[tuple[int, str], dict[str, tuple[int, ...]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not self.plans:
            raise ReshardError("a ReshardPlan needs at least one tensor")
        names = [n for n, _ in self.plans]
        if names != sorted(set(names)):
            raise ReshardError("ReshardPlan tensor names must be unique and sorted")
        counts = {(p.src.num_ranks, p.dst.num_ranks) for _, p in self.plans}
        if len(counts) != 1:
            raise ReshardError(f"all tensors must share the two meshes' rank counts, got {counts}")
        slots: dict[tuple[int, int, torch.dtype], list[Slot]] = {}
        for dst_rank in range(self.num_dst_ranks):
            for name, p in self.plans:
                for piece in p.pieces[dst_rank]:
                    if not piece.local:
                        buffer = slots.setdefault((piece.src_rank, dst_rank, p.src.dtype), [])
                        offset = buffer[-1].offset + buffer[-1].piece.numel if buffer else 0
                        buffer.append(Slot(name, dst_rank, piece, offset))
        self._slots.update((key, tuple(v)) for key, v in slots.items())
        self._by_name.update(self.plans)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.plans)

    @property
    def num_src_ranks(self) -> int:
        return self.plans[0][1].src.num_ranks

    @property
    def num_dst_ranks(self) -> int:
        return self.plans[0][1].dst.num_ranks

    def __getitem__(self, name: str) -> TransferPlan:
        return self._by_name[name]

    @property
    def fingerprint(self) -> str:
        """A digest of every layout: two sides with equal fingerprints hold the same plan."""
        if not self._digest:
            text = repr([(n, p.src, p.dst) for n, p in self.plans]) + repr(self.colocated)
            self._digest.append(hashlib.sha256(text.encode()).hexdigest()[:16])
        return self._digest[0]

    def local_shapes(self, rank: int, side: str) -> dict[str, tuple[int, ...]]:
        """Each tensor's local shape on `rank` of the "source" or "destination" mesh."""
        key = (rank, side)
        if key not in self._shapes:
            self._shapes[key] = {
                n: (p.src if side == "source" else p.dst).local_shape(rank) for n, p in self.plans
            }
        return self._shapes[key]

    def buffers(self, src_rank: int) -> tuple[tuple[int, torch.dtype], ...]:
        """(destination rank, dtype) of every staging buffer `src_rank` fills, in order."""
        keys = [(dst, dtype) for (src, dst, dtype) in self._slots if src == src_rank]
        return tuple(sorted(keys, key=lambda k: (k[0], str(k[1]))))

    def buffer_groups(self, src_rank: int) -> tuple[tuple[torch.dtype, tuple[int, ...]], ...]:
        """The distinct staging buffers `src_rank` fills: (dtype, destination ranks).

        Destinations that need the very same source boxes from this rank (replicated
        destinations, typically) share one buffer: it is packed and shared once, and each of
        them reads all of it, so no destination reads a byte it does not need.
        """
        groups: dict[tuple[torch.dtype, tuple[tuple[str, Box], ...]], list[int]] = {}
        for dst_rank, dtype in self.buffers(src_rank):
            slots = self.slots(src_rank, dst_rank, dtype)
            content = tuple((s.name, s.piece.src_box) for s in slots)
            groups.setdefault((dtype, content), []).append(dst_rank)
        return tuple((dtype, tuple(ranks)) for (dtype, _), ranks in groups.items())

    def slots(self, src_rank: int, dst_rank: int, dtype: torch.dtype) -> tuple[Slot, ...]:
        """What one staging buffer holds, back to back from offset 0 (empty: no buffer)."""
        return self._slots.get((src_rank, dst_rank, dtype), ())

    def serves(self, src_rank: int, name: str) -> bool:
        """Whether any destination reads part of tensor `name` from `src_rank`."""
        return any(
            piece.src_rank == src_rank and not piece.local
            for pieces in self[name].pieces
            for piece in pieces
        )

    def buffer_numel(self, src_rank: int, dst_rank: int, dtype: torch.dtype) -> int:
        return sum(s.piece.numel for s in self.slots(src_rank, dst_rank, dtype))

    @property
    def bytes_moved(self) -> int:
        return sum(p.bytes_moved for _, p in self.plans)


def _name(item: tuple[str, Layout]) -> str:
    return item[0]


class PlanCache:
    """Plans per tensor, kept across versions: a tensor's plan is computed once per pair of
    layouts, and an unchanged state dict gets back the very same `ReshardPlan` object.

    Attributes:
        computed: how many per-tensor plans were computed (not served from the cache).
    """

    def __init__(self) -> None:
        self._per_tensor: dict[tuple[Layout, Layout, bool], TransferPlan] = {}
        self._last: tuple[object, ReshardPlan] | None = None
        self.computed = 0

    def get(
        self, src: Mapping[str, Layout], dst: Mapping[str, Layout], *, colocated: bool = False
    ) -> ReshardPlan:
        """The plan for moving every tensor named in `src` to the layout named in `dst`.

        Raises `ReshardError` when the two mappings do not name the same tensors, or a
        tensor's shapes or dtypes differ between them.
        """
        if set(src) != set(dst):
            missing, extra = sorted(set(src) - set(dst)), sorted(set(dst) - set(src))
            raise ReshardError(
                f"source and destination name different tensors: only in source {missing}, "
                f"only in destination {extra}"
            )
        key = (sorted(src.items(), key=_name), sorted(dst.items(), key=_name), colocated)
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        plans = []
        for name in sorted(src):
            pair = (src[name], dst[name], colocated)
            if pair not in self._per_tensor:
                try:
                    self._per_tensor[pair] = plan(src[name], dst[name], colocated=colocated)
                except ReshardError as e:
                    raise ReshardError(f"tensor {name!r}: {e}") from None
                self.computed += 1
            plans.append((name, self._per_tensor[pair]))
        result = ReshardPlan(tuple(plans), colocated=colocated)
        self._last = (key, result)
        return result
