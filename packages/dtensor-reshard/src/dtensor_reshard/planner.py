"""`plan(src, dst)`: which slices of which source shards each destination shard needs.

The planner is pure (no process group, no Monarch) and deterministic, so the source and the
destination side can each compute the same plan from the two layouts and agree, without
messages, on where every byte goes.

"Already local" (bytes that need not move): by default the two meshes are different process
sets and nothing is local. With `colocated=True` both layouts must carry `world_ranks` in one
shared process group; a destination element is local when the source rank with the same world
rank holds it. That source is then used for the piece, which `execute` copies in-process.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from dataclasses import dataclass

from dtensor_reshard.box import Box
from dtensor_reshard.errors import ReshardError
from dtensor_reshard.layout import Layout


@dataclass(frozen=True)
class Piece:
    """One block a destination rank receives from one source rank.

    Attributes:
        src_rank: mesh rank (row-major) in the source layout that serves the block.
        src_box: the block in the source rank's local-shard coordinates.
        dst_box: the block in the destination rank's local-shard coordinates.
        global_box: the block in global coordinates (same sizes as the two above).
        local: True when the source rank lives in the destination's own process
            (`plan(..., colocated=True)`); such a piece moves no bytes.
    """

    src_rank: int
    src_box: Box
    dst_box: Box
    global_box: Box
    local: bool = False

    @property
    def numel(self) -> int:
        return self.global_box.numel


@dataclass(frozen=True)
class TransferPlan:
    """Per destination rank, the pieces that exactly tile its local shard.

    Attributes:
        src: the source layout.
        dst: the destination layout (same global shape and dtype).
        pieces: `pieces[d]` are destination rank `d`'s pieces, in row-major order of their
            global boxes; their `dst_box`es are disjoint and cover the local shard.
    """

    src: Layout
    dst: Layout
    pieces: tuple[tuple[Piece, ...], ...]

    def for_dst(self, dst_rank: int) -> tuple[Piece, ...]:
        return self.pieces[self.dst.check_rank(dst_rank, "destination")]

    def for_src(self, src_rank: int) -> tuple[tuple[int, Piece], ...]:
        """(destination rank, piece) for every remote piece `src_rank` serves."""
        self.src.check_rank(src_rank, "source")
        return tuple(
            (dst_rank, piece)
            for dst_rank, pieces in enumerate(self.pieces)
            for piece in pieces
            if piece.src_rank == src_rank and not piece.local
        )

    @property
    def bytes_moved(self) -> int:
        """Bytes crossing process boundaries: every destination byte not already local."""
        numel = sum(p.numel for pieces in self.pieces for p in pieces if not p.local)
        return numel * self.dst.itemsize

    def served_bytes(self) -> tuple[int, ...]:
        """Bytes each source rank serves (to see how reads spread across replicas)."""
        served = [0] * self.src.num_ranks
        for pieces in self.pieces:
            for piece in pieces:
                if not piece.local:
                    served[piece.src_rank] += piece.numel * self.src.itemsize
        return tuple(served)


def check_compatible(src: Layout, dst: Layout) -> None:
    if src.global_shape != dst.global_shape:
        raise ReshardError(
            f"global shapes differ: source {src.global_shape}, destination {dst.global_shape}"
        )
    if src.dtype != dst.dtype:
        raise ReshardError(f"dtypes differ: source {src.dtype}, destination {dst.dtype}")


def _colocated_sources(src: Layout, dst: Layout) -> list[int | None]:
    """For each destination rank, the source rank in the same process, if any."""
    if src.world_ranks is None or dst.world_ranks is None:
        raise ReshardError(
            "colocated=True needs world_ranks on both layouts (ranks in one shared process "
            "group); Layout.from_dtensor fills them in"
        )
    by_world = {w: r for r, w in enumerate(src.world_ranks)}
    return [by_world.get(w) for w in dst.world_ranks]


def plan(src: Layout, dst: Layout, *, colocated: bool = False) -> TransferPlan:
    """Plans moving a tensor laid out as `src` into the layout `dst`.

    Each destination rank gets one piece per distinct source shard it overlaps. Source ranks
    holding the same shard (replicas) are interchangeable: the piece goes to the replica in
    the destination's own process when there is one (`colocated=True`), else to the replica
    that has served the fewest bytes so far, so reads spread across replicas. The plan's
    `bytes_moved` is then the minimum: each destination element not already local, once.

    Raises `ReshardError` when the global shapes or dtypes differ.
    """
    check_compatible(src, dst)
    colocated_src = _colocated_sources(src, dst) if colocated else [None] * dst.num_ranks

    # Replica groups: source ranks holding the same (non-empty) global box.
    groups: dict[Box, list[int]] = defaultdict(list)
    for rank in range(src.num_ranks):
        box = src.local_box(rank)
        if box.numel > 0:
            groups[box].append(rank)
    # Distinct source boxes are the Cartesian product of per-dimension interval partitions,
    # so overlaps are found per dimension by bisection instead of testing every pair.
    ndim = len(src.global_shape)
    starts = [sorted({b.offsets[d] for b in groups}) for d in range(ndim)]
    by_corner = {box.offsets: box for box in groups}

    load = [0] * src.num_ranks
    all_pieces: list[tuple[Piece, ...]] = []
    for dst_rank in range(dst.num_ranks):
        dst_box = dst.local_box(dst_rank)
        if dst_box.numel == 0:
            all_pieces.append(())
            continue
        per_dim = []
        for d in range(ndim):
            lo = bisect.bisect_right(starts[d], dst_box.offsets[d]) - 1
            hi = bisect.bisect_left(starts[d], dst_box.ends[d])
            per_dim.append(starts[d][lo:hi])
        pieces = []
        for corner in itertools.product(*per_dim):
            src_box = by_corner[corner]
            common = src_box.intersect(dst_box)
            if common is None:
                continue
            replicas = groups[src_box]
            here = colocated_src[dst_rank]
            local = here is not None and here in replicas
            chosen = here if local and here is not None else min(replicas, key=lambda r: load[r])
            if not local:
                load[chosen] += common.numel
            pieces.append(
                Piece(
                    src_rank=chosen,
                    src_box=common.relative_to(src_box),
                    dst_box=common.relative_to(dst_box),
                    global_box=common,
                    local=local,
                )
            )
        all_pieces.append(tuple(pieces))
    return TransferPlan(src=src, dst=dst, pieces=tuple(all_pieces))
