"""Bucket planning, a pure function: no Monarch, no shared memory."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from rdma_tensor._packing import BUCKET_ALIGN, ENTRY_ALIGN, TensorSpec, pack_buckets

DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.float64]


def test_packs_in_order_and_closes_buckets_at_the_target_size() -> None:
    specs = [TensorSpec(f"t{i}", torch.float32, (256,)) for i in range(5)]  # 1 KiB each
    layout = pack_buckets(specs, bucket_bytes=2048)
    assert [e.name for e in layout.entries] == [f"t{i}" for i in range(5)]
    assert [e.bucket for e in layout.entries] == [0, 0, 1, 1, 2]
    assert [e.offset for e in layout.entries] == [0, 1024, 0, 1024, 0]
    assert layout.bucket_nbytes == (4096, 4096, 4096)


def test_a_tensor_larger_than_a_bucket_gets_its_own() -> None:
    specs = [
        TensorSpec("small", torch.uint8, (10,)),
        TensorSpec("big", torch.float32, (10_000,)),
        TensorSpec("tail", torch.uint8, (3,)),
    ]
    layout = pack_buckets(specs, bucket_bytes=1000)
    assert [e.bucket for e in layout.entries] == [0, 1, 2]
    assert layout.bucket_nbytes[1] == 40_960


def test_offsets_are_aligned_so_any_dtype_can_be_viewed() -> None:
    specs = [TensorSpec("a", torch.uint8, (3,)), TensorSpec("b", torch.float64, (2,))]
    layout = pack_buckets(specs, bucket_bytes=1 << 20)
    assert layout.entries[1].offset == ENTRY_ALIGN


def test_empty_or_nonsense_input_is_rejected() -> None:
    with pytest.raises(ValueError, match="empty state dict"):
        pack_buckets([], bucket_bytes=1024)
    with pytest.raises(ValueError, match="bucket_bytes must be positive"):
        pack_buckets([TensorSpec("a", torch.uint8, (1,))], bucket_bytes=0)


@given(
    st.lists(
        st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(0, 40), min_size=0, max_size=3)),
        min_size=1,
        max_size=30,
    ),
    st.integers(64, 20_000),
)
def test_entries_never_overlap_and_stay_inside_their_bucket(
    tensors: list[tuple[torch.dtype, list[int]]], bucket_bytes: int
) -> None:
    specs = [TensorSpec(f"t{i}", dt, tuple(shape)) for i, (dt, shape) in enumerate(tensors)]
    layout = pack_buckets(specs, bucket_bytes)
    assert [e.name for e in layout.entries] == [s.name for s in specs]
    assert all(n % BUCKET_ALIGN == 0 and n > 0 for n in layout.bucket_nbytes)
    spans: dict[int, list[tuple[int, int]]] = {}
    for spec, e in zip(specs, layout.entries, strict=True):
        assert e.nbytes == spec.nbytes
        assert e.offset % ENTRY_ALIGN == 0
        assert e.offset + e.nbytes <= layout.bucket_nbytes[e.bucket]
        # Only a tensor that alone exceeds the target may overflow it.
        assert e.offset + e.nbytes <= bucket_bytes or e.offset == 0
        spans.setdefault(e.bucket, []).append((e.offset, e.offset + e.nbytes))
    for bucket_spans in spans.values():
        bucket_spans.sort()
        for (_, end), (start, _) in itertools.pairwise(bucket_spans):
            assert end <= start
    buckets = [e.bucket for e in layout.entries]
    assert buckets == sorted(buckets)
    assert set(buckets) == set(range(len(layout.bucket_nbytes)))
