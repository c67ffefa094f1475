"""The data contract of weight sync: what one published version looks like.

A `Manifest` is small (a few hundred bytes per tensor) and travels in actor messages; the
bytes it describes stay in the publisher's staging memory until a reader pulls them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rdma_tensor.handle import TensorHandle


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the state dict: `nbytes` bytes at byte `offset` of bucket `bucket`.

    `shape` and `dtype` are the publisher's; readers may cast on the way (see `pull`).
    """

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    bucket: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Layout:
    """How a state dict packs into buckets; every version of a publisher shares it.

    `bucket_nbytes[k]` is bucket k's size in bytes (a multiple of 4096, so each bucket can be
    registered with RDMA on its own); `total_nbytes` is their sum.
    """

    entries: tuple[TensorEntry, ...]
    bucket_nbytes: tuple[int, ...]

    @property
    def total_nbytes(self) -> int:
        return sum(self.bucket_nbytes)


@dataclass(frozen=True)
class SlotRef:
    """One staging slot: a 4096-byte header and one handle per bucket (all uint8)."""

    header: TensorHandle
    buckets: tuple[TensorHandle, ...]


@dataclass(frozen=True)
class Manifest:
    """Version `version` of publisher `publisher_id`, staged in slot `slot`.

    `slots` lists every staging slot of the publisher, so a reader whose slot was reused
    meanwhile finds the newer version elsewhere without asking the publisher.
    """

    publisher_id: str
    version: int
    slot: int
    layout: Layout
    slots: tuple[SlotRef, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data (without padding)."""
        return sum(e.nbytes for e in self.layout.entries)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.layout.entries)
