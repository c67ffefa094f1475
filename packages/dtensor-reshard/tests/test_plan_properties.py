"""Property tests: plans agree with torch.distributed.tensor's own sharding, element by element.

Expected shards come from torch's `distribute_tensor` (run for every rank in one process by
`LocalTensorMode`, see conftest.py) and torch's `_compute_local_shape_and_global_offset`;
nothing here re-implements torch's chunking rules.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from math import prod

import torch
from dtensor_reshard import Layout, Placement, PlanCache, TransferPlan, plan
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

TorchShards = Callable[[Layout, torch.Tensor], list[torch.Tensor]]
WORLD = 16  # colocated layouts draw world ranks from this many processes

DTYPES = [torch.float32, torch.float16, torch.int64]  # fp16 holds every id below 2048 exactly


@st.composite
def global_shapes(draw: st.DrawFn) -> tuple[int, ...]:
    ndim = draw(st.integers(1, 3))
    return tuple(draw(st.lists(st.integers(0, 11), min_size=ndim, max_size=ndim)))


@st.composite
def mesh_shapes(draw: st.DrawFn) -> tuple[int, ...]:
    if draw(st.booleans()):
        return (draw(st.integers(1, 8)),)
    a = draw(st.integers(1, 4))
    return (a, draw(st.integers(1, 8 // a)))


@st.composite
def layouts(draw: st.DrawFn, shape: tuple[int, ...], dtype: torch.dtype, colocated: bool) -> Layout:
    mesh = draw(mesh_shapes())
    options: list[Placement] = [Replicate(), *(Shard(d) for d in range(len(shape)))]
    placements = tuple(draw(st.sampled_from(options)) for _ in mesh)
    world = None
    if colocated:
        world = tuple(draw(st.permutations(range(WORLD)))[: prod(mesh)])
    return Layout(shape, dtype, mesh, placements, world)


@st.composite
def layout_pairs(draw: st.DrawFn) -> tuple[Layout, Layout, bool]:
    shape = draw(global_shapes())
    dtype = draw(st.sampled_from(DTYPES))
    colocated = draw(st.booleans())
    return draw(layouts(shape, dtype, colocated)), draw(layouts(shape, dtype, colocated)), colocated


def _ids(layout: Layout) -> torch.Tensor:
    """The full tensor whose element values are their own flat global indices."""
    return torch.arange(prod(layout.global_shape), dtype=layout.dtype).reshape(layout.global_shape)


def _assemble(p: TransferPlan, src_shards: list[torch.Tensor], dst_rank: int) -> torch.Tensor:
    """Builds a destination shard from the plan alone, checking each element is written once."""
    shape = p.dst.local_shape(dst_rank)
    out = torch.full(shape, -1, dtype=p.dst.dtype)
    writes = torch.zeros(shape, dtype=torch.int64)
    for piece in p.for_dst(dst_rank):
        assert piece.src_box.sizes == piece.dst_box.sizes == piece.global_box.sizes
        piece.dst_box.view(out).copy_(piece.src_box.view(src_shards[piece.src_rank]))
        piece.dst_box.view(writes).add_(1)
    assert bool((writes == 1).all()), f"rank {dst_rank}: write counts {writes.tolist()}"
    return out


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout_pairs())
def test_plan_matches_torch(torch_shards: TorchShards, pair: tuple[Layout, Layout, bool]) -> None:
    src, dst, colocated = pair
    p = plan(src, dst, colocated=colocated)

    # Boxes equal torch's own (shape, global offset) per rank, empty shards included.
    for layout in (src, dst):
        for rank in range(layout.num_ranks):
            box = layout.local_box(rank)
            want = _compute_local_shape_and_global_offset(
                layout.global_shape, layout.mesh_shape, list(layout.coordinate(rank)),
                list(layout.placements),
            )  # fmt: skip
            assert (box.sizes, box.offsets) == want

    src_shards = torch_shards(src, _ids(src))
    dst_shards = torch_shards(dst, _ids(dst))

    # Assembling every destination shard from the plan gives exactly torch's slices.
    for rank in range(dst.num_ranks):
        assert torch.equal(_assemble(p, src_shards, rank), dst_shards[rank])

    # Bytes moved = the minimum: destination elements its own process does not hold already.
    here = {w: r for r, w in enumerate(src.world_ranks or ())}
    needed = 0
    for rank, shard in enumerate(dst_shards):
        mine = set(shard.flatten().tolist())
        if colocated and dst.world_ranks is not None and dst.world_ranks[rank] in here:
            mine -= set(src_shards[here[dst.world_ranks[rank]]].flatten().tolist())
        needed += len(mine)
    assert p.bytes_moved == needed * src.itemsize

    # Local pieces really come from the destination's own process.
    for rank, pieces in enumerate(p.pieces):
        for piece in pieces:
            if piece.local:
                assert src.world_ranks is not None
                assert dst.world_ranks is not None
                assert src.world_ranks[piece.src_rank] == dst.world_ranks[rank]

    # Staging buffers (one per source and destination) hold the remote pieces back to back.
    staged = PlanCache().get({"x": src}, {"x": dst}, colocated=colocated)
    total = 0
    for rank in range(src.num_ranks):
        for dst_rank, dtype in staged.buffers(rank):
            offset = 0
            for slot in staged.slots(rank, dst_rank, dtype):
                assert (slot.offset, slot.piece.src_rank, slot.piece.local) == (offset, rank, False)
                offset += slot.piece.numel
            total += offset
    assert total * src.itemsize == p.bytes_moved

    # Reads spread across replicas: within a group of ranks holding the same shard, served
    # bytes differ by at most one piece (greedy least-loaded assignment).
    groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for rank, shard in enumerate(src_shards):
        if shard.numel() > 0:
            groups[tuple(sorted(shard.flatten().tolist()))].append(rank)
    served = p.served_bytes()
    for ranks in groups.values():
        sizes = [piece.numel * src.itemsize for r in ranks for _, piece in p.for_src(r)]
        loads = [served[r] for r in ranks]
        assert max(loads) - min(loads) <= max(sizes, default=0)
