"""`ReshardPlan` staging layout and `PlanCache` reuse across versions."""

from __future__ import annotations

import pytest
import torch
from dtensor_reshard import Layout, PlanCache, ReshardError
from torch.distributed.tensor import Replicate, Shard


def _layouts(mesh: tuple[int, ...], placements: dict[str, tuple[object, ...]]) -> dict[str, Layout]:
    shapes = {
        "w": ((6, 4), torch.float32),
        "b": ((6,), torch.float32),
        "h": ((4, 4), torch.bfloat16),
    }
    return {
        name: Layout(shapes[name][0], shapes[name][1], mesh, placements[name])  # type: ignore[arg-type]
        for name in placements
    }


SRC = _layouts((2,), {"w": (Shard(0),), "b": (Shard(0),), "h": (Replicate(),)})
DST = _layouts((3,), {"w": (Shard(1),), "b": (Replicate(),), "h": (Shard(0),)})


def test_staging_buffers_hold_each_remote_piece_once() -> None:
    plan = PlanCache().get(SRC, DST)
    assert plan.names == ("b", "h", "w")
    staged = 0
    for src_rank in range(2):
        for dst_rank, dtype in plan.buffers(src_rank):
            offset = 0
            for slot in plan.slots(src_rank, dst_rank, dtype):
                assert (slot.offset, slot.dst_rank) == (offset, dst_rank)
                assert plan[slot.name].src.dtype == dtype
                offset += slot.piece.numel
                staged += slot.piece.numel * dtype.itemsize
            assert offset == plan.buffer_numel(src_rank, dst_rank, dtype) > 0
    assert staged == plan.bytes_moved == sum(p.bytes_moved for _, p in plan.plans)
    # h is replicated on the source: its two destination row blocks go to different replicas.
    served = [plan.buffer_numel(r, d, torch.bfloat16) for r in range(2) for d in range(3)]
    assert served == [8, 0, 0, 0, 8, 0]


def test_cache_reuses_plans_across_versions_and_replans_only_what_changed() -> None:
    cache = PlanCache()
    first = cache.get(SRC, DST)
    assert cache.computed == 3
    assert cache.get(dict(SRC), dict(DST)) is first  # next version, same layouts
    assert cache.computed == 3
    changed = dict(DST, b=Layout((6,), torch.float32, (3,), (Shard(0),)))
    second = cache.get(SRC, changed)
    assert cache.computed == 4  # only b was planned again
    assert second["w"] is first["w"]
    assert second.fingerprint != first.fingerprint


def test_cache_rejects_mismatched_state_dicts() -> None:
    with pytest.raises(ReshardError, match=r"only in source \['h'\], only in destination \[\]"):
        PlanCache().get(SRC, {k: v for k, v in DST.items() if k != "h"})
    bad = dict(DST, w=Layout((6, 5), torch.float32, (3,), (Shard(1),)))
    with pytest.raises(ReshardError, match="tensor 'w': global shapes differ"):
        PlanCache().get(SRC, bad)


def test_replicated_destinations_share_one_staging_buffer() -> None:
    src = {"w": Layout((8, 4), torch.float32, (2,), (Shard(0),))}
    dst = {"w": Layout((8, 4), torch.float32, (2, 3), (Replicate(), Shard(1)))}
    plan = PlanCache().get(src, dst)
    for rank in range(2):
        # Destinations (0, j) and (1, j) hold the same columns: one buffer per column block.
        assert plan.buffer_groups(rank) == tuple(
            (torch.float32, (j, 3 + j)) for j in range(3) if dst["w"].local_box(j).numel
        )
