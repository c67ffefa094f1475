"""Packing a state dict into buckets: a pure function, tested without Monarch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rdma_tensor.manifest import BucketLayout, TensorEntry

ENTRY_ALIGN = 64  # a cache line; also satisfies every dtype's alignment for `view(dtype)`
BUCKET_ALIGN = 4096  # a page, so every bucket can be registered for RDMA on its own


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * self.dtype.itemsize


def _round_up(n: int, k: int) -> int:
    return (n + k - 1) // k * k


def pack_buckets(specs: Sequence[TensorSpec], bucket_bytes: int) -> BucketLayout:
    """Greedy packing in the given order: a bucket closes when the next tensor would push it
    past `bucket_bytes`; a tensor larger than that gets a bucket of its own.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    if not specs:
        raise ValueError("cannot pack an empty state dict into buckets")
    entries: list[TensorEntry] = []
    sizes: list[int] = []
    bucket, used = 0, 0
    for spec in specs:
        offset = _round_up(used, ENTRY_ALIGN)
        if used > 0 and offset + spec.nbytes > bucket_bytes:
            sizes.append(_round_up(used, BUCKET_ALIGN))
            bucket, offset = bucket + 1, 0
        entries.append(TensorEntry(spec.name, spec.dtype, spec.shape, bucket, offset, spec.nbytes))
        used = offset + spec.nbytes
    sizes.append(_round_up(max(used, 1), BUCKET_ALIGN))
    return BucketLayout(tuple(entries), tuple(sizes))
