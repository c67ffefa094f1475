"""Layouts from plain descriptions, and the errors bad input gets (before anything moves)."""

from __future__ import annotations

import re

import pytest
import torch
from dtensor_reshard import Box, Layout, ReshardError, plan
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard


def test_nested_uneven_sharding_of_one_dim() -> None:
    # 10 rows on mesh (3, 2), both mesh dims cutting dim 0: torch.chunk(10, 3) gives 4, 4, 2
    # rows, then each is chunked in two.
    layout = Layout((10, 3), torch.float32, (3, 2), (Shard(0), Shard(0)))
    boxes = [layout.local_box(r) for r in range(6)]
    assert [(b.offsets[0], b.sizes[0]) for b in boxes] == [
        (0, 2),
        (2, 2),
        (4, 2),
        (6, 2),
        (8, 1),
        (9, 1),
    ]
    assert all(b.sizes[1] == 3 for b in boxes)


def test_empty_trailing_shard_sits_at_the_end() -> None:
    # torch.chunk(5, 4) makes chunks of 2: ranks get 2, 2, 1 and an empty shard.
    layout = Layout((5,), torch.int64, (4,), (Shard(0),))
    assert [layout.local_box(r) for r in range(4)] == [
        Box((0,), (2,)), Box((2,), (2,)), Box((4,), (1,)), Box((5,), (0,)),
    ]  # fmt: skip
    assert plan(layout, Layout((5,), torch.int64, (1,), (Replicate(),))).bytes_moved == 40


def test_negative_shard_dim_is_normalized_and_ranks_are_row_major() -> None:
    layout = Layout((4, 6), torch.bfloat16, (2, 2), (Replicate(), Shard(-1)))
    assert layout.placements == (Replicate(), Shard(1))
    assert layout.coordinate(3) == (1, 1)
    assert layout.rank_of((1, 0)) == 2
    assert layout.describe() == "(4, 6) bfloat16 on mesh (2, 2) [R, S(1)]"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"placements": (Partial(),)}, "unsupported placement Partial"),
        ({"placements": (_StridedShard(0, split_factor=2),)}, "unsupported placement"),
        ({"placements": ("S(0)",)}, "unsupported placement 'S(0)'"),
        ({"placements": (Shard(2),)}, "Shard(dim=2) is out of range for a 2-dimensional"),
        ({"placements": (Shard(0), Shard(1))}, "2 placements for a 1-dimensional mesh"),
        ({"mesh_shape": (0,)}, "all >= 1"),
        ({"global_shape": (-1, 2)}, "negative size"),
        ({"world_ranks": (0, 0, 1, 2)}, "4 distinct ranks"),
        ({"dtype": "float32"}, "dtype must be a torch.dtype"),
    ],
)
def test_bad_layouts_are_rejected(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {
        "global_shape": (4, 4),
        "dtype": torch.float32,
        "mesh_shape": (4,),
        "placements": (Shard(0),),
    }
    args.update(kwargs)
    with pytest.raises(ReshardError, match=re.escape(message)):
        Layout(**args)  # type: ignore[arg-type]


def test_incompatible_layouts_and_ranks_outside_the_mesh() -> None:
    src = Layout((4, 4), torch.float32, (4,), (Shard(0),))
    with pytest.raises(ReshardError, match=r"global shapes differ: source \(4, 4\)"):
        plan(src, Layout((4, 5), torch.float32, (2,), (Shard(1),)))
    with pytest.raises(ReshardError, match="dtypes differ"):
        plan(src, Layout((4, 4), torch.float16, (2,), (Shard(1),)))
    with pytest.raises(ReshardError, match="colocated=True needs world_ranks"):
        plan(src, src, colocated=True)
    p = plan(src, Layout((4, 4), torch.float32, (2,), (Shard(1),)))
    with pytest.raises(ReshardError, match=r"destination rank 2 is outside the mesh \(2,\)"):
        p.for_dst(2)
    with pytest.raises(ReshardError, match="source rank -1 is outside"):
        p.for_src(-1)
    with pytest.raises(ReshardError, match=r"coordinate \(0, 0\) is outside"):
        src.rank_of((0, 0))


def test_from_dtensor_rejects_plain_tensors() -> None:
    with pytest.raises(ReshardError, match="expected a DTensor, got Tensor"):
        Layout.from_dtensor(torch.zeros(2))  # type: ignore[arg-type]


def test_colocated_plan_moves_only_what_the_process_lacks() -> None:
    # Four processes hold rows Shard(0); the same four processes want columns Shard(1):
    # each keeps the quarter it already has and reads the other three.
    world = (0, 1, 2, 3)
    src = Layout((8, 8), torch.float32, (4,), (Shard(0),), world)
    dst = Layout((8, 8), torch.float32, (4,), (Shard(1),), world)
    p = plan(src, dst, colocated=True)
    assert p.bytes_moved == 64 * 4 * 3 // 4
    assert [sum(x.local for x in pieces) for pieces in p.pieces] == [1, 1, 1, 1]
    assert plan(src, dst).bytes_moved == 64 * 4  # distinct process sets: nothing is local


def test_replicated_sources_share_the_reads() -> None:
    src = Layout((8, 8), torch.float32, (4,), (Replicate(),))
    dst = Layout((8, 8), torch.float32, (4,), (Shard(0),))
    assert plan(src, dst).served_bytes() == (64, 64, 64, 64)
