"""The data contract of weight sync: what one published version looks like.

A `Manifest` is small (a few hundred bytes per tensor) and travels in actor messages; the
bytes it describes stay in the publisher's staging memory until a reader pulls them.

Every manifest of one publisher shares its `bucket_layout` and `slots`, and unpickling those (dozens
of entries and Monarch `RDMABuffer`s) is what made a manifest slow to send: about 1 ms per
hop at 16 buckets on a loaded 2-core machine. So a manifest pickles them as one opaque,
pre-pickled blob, and each process decodes a publisher's blob once and reuses the objects
(a relaying process re-sends the blob without decoding it again).
"""

from __future__ import annotations

import pickle
from collections import OrderedDict
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
class BucketLayout:
    """How a state dict packs into buckets (byte ranges of a staging slot); every version of a
    publisher shares it. Not to be confused with `dtensor_reshard.Layout`, which says how a
    DTensor is sharded over a mesh.

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
    bucket_layout: BucketLayout
    slots: tuple[SlotRef, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data (without padding)."""
        return sum(e.nbytes for e in self.bucket_layout.entries)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.bucket_layout.entries)

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        blob = _stream_blob(self.publisher_id, self.bucket_layout, self.slots)
        return _rebuild_manifest, (self.publisher_id, self.version, self.slot, blob)


# Per publisher: its layout and slots, and their pickled form. A few recent publishers only.
_streams: OrderedDict[str, tuple[BucketLayout, tuple[SlotRef, ...], bytes]] = OrderedDict()
_MAX_STREAMS = 32


def _remember(
    publisher_id: str, layout: BucketLayout, slots: tuple[SlotRef, ...], blob: bytes
) -> None:
    _streams[publisher_id] = (layout, slots, blob)
    _streams.move_to_end(publisher_id)
    while len(_streams) > _MAX_STREAMS:
        _streams.popitem(last=False)


def _stream_blob(publisher_id: str, layout: BucketLayout, slots: tuple[SlotRef, ...]) -> bytes:
    cached = _streams.get(publisher_id)
    if cached is not None and cached[0] is layout and cached[1] is slots:
        return cached[2]
    blob = pickle.dumps((layout, slots), protocol=pickle.HIGHEST_PROTOCOL)
    _remember(publisher_id, layout, slots, blob)
    return blob


def _rebuild_manifest(publisher_id: str, version: int, slot: int, blob: bytes) -> Manifest:
    cached = _streams.get(publisher_id)
    if cached is not None and cached[2] == blob:
        layout, slots = cached[0], cached[1]
    else:
        layout, slots = pickle.loads(blob)
        _remember(publisher_id, layout, slots, blob)
    return Manifest(publisher_id, version, slot, layout, slots)
