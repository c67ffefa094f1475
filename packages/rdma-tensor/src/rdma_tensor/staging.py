"""Staging slots: where a published version waits for its readers.

A slot is one shared-memory segment: a 4096-byte header, then the buckets. The header is a
seqlock with a state:

    words[1] seq      odd while the slot is being (re)written, even otherwise
    words[2] state    EMPTY, WRITING, COMPLETE or CLOSED
    words[3] version  the version being written or held
    words[8 + k]      the version whose bucket k is completely written (pipelined readers)

The publisher claims a slot by taking an exclusive `flock` on it, which fails while any
same-machine reader holds a shared lease; so a reader copying from a slot cannot be torn, and
a lease dies with its holder. Readers without leases (RDMA, possibly on other machines) read
the header before and after the bytes and retry when `seq` moved. With two or more slots the
publisher writes a free one while readers finish the previous version.
"""

from __future__ import annotations

import enum
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import torch

from rdma_tensor import _rdma, _shm
from rdma_tensor._owner import Owner
from rdma_tensor.handle import make_handle
from rdma_tensor.manifest import BucketLayout, SlotRef
from rdma_tensor.transport import Transport

HEADER_BYTES = 4096
_MAGIC = 0x544F4C5354414452  # "RDATSLOT"
_W_MAGIC, _W_SEQ, _W_STATE, _W_VERSION, _W_BUCKETS = 0, 1, 2, 3, 8
MAX_BUCKETS = HEADER_BYTES // 8 - _W_BUCKETS


class SlotState(enum.IntEnum):
    EMPTY = 0
    WRITING = 1
    COMPLETE = 2
    CLOSED = 3


@dataclass(frozen=True)
class SlotHeader:
    """A snapshot of one slot's header."""

    seq: int
    state: SlotState
    version: int

    @staticmethod
    def parse(header: torch.Tensor) -> SlotHeader:
        """Parses the first words of a header given as uint8 bytes."""
        words = header[:32].view(torch.int64).tolist()
        if words[_W_MAGIC] != _MAGIC:
            raise ValueError("not a staging-slot header")
        return SlotHeader(words[_W_SEQ], SlotState(words[_W_STATE]), words[_W_VERSION])

    @property
    def complete(self) -> bool:
        return self.state is SlotState.COMPLETE and self.seq % 2 == 0


def bucket_version(header: torch.Tensor, bucket: int) -> int:
    """The version whose bucket `bucket` is completely written in this slot."""
    start = 8 * (_W_BUCKETS + bucket)
    return int(header[start : start + 8].view(torch.int64).item())


class StagingSlot:
    """The publisher's side of one slot."""

    def __init__(self, layout: BucketLayout, owner: Owner, forced: Transport | None) -> None:
        self.segment = _shm.new_segment(HEADER_BYTES + layout.total_nbytes)
        self._fd = _shm.export_cpu(self.segment).file.fd  # this process's fd, for leases
        self._words = self.segment[:HEADER_BYTES].view(torch.int64)
        self._words[_W_MAGIC] = _MAGIC
        self.buckets: list[torch.Tensor] = []
        start = HEADER_BYTES
        for size in layout.bucket_nbytes:
            self.buckets.append(self.segment[start : start + size])
            start += size
        self._header_bytes = self.segment[:HEADER_BYTES]
        header, rdma = make_handle(self._header_bytes, owner, forced)
        handles, self._rdma = [], [rdma]
        for bucket in self.buckets:
            handle, rdma = make_handle(bucket, owner, forced)
            handles.append(handle)
            self._rdma.append(rdma)
        self.ref = SlotRef(header, tuple(handles))
        self.version = -1
        self.pinned = False

    @property
    def header(self) -> SlotHeader:
        return SlotHeader.parse(self._header_bytes)

    def try_claim(self, version: int) -> bool:
        """Marks the slot as being rewritten with `version`; False while readers lease it."""
        if not _shm.try_lock(self._fd, exclusive=True):
            return False
        try:
            self._words[_W_SEQ] += 1  # odd first: lock-free readers see the change
            self._words[_W_STATE] = SlotState.WRITING
            self._words[_W_VERSION] = version
        finally:
            _shm.unlock(self._fd)
        self.version = version
        return True

    def mark_bucket(self, bucket: int, version: int) -> None:
        self._words[_W_BUCKETS + bucket] = version

    def complete(self) -> None:
        self._words[_W_STATE] = SlotState.COMPLETE
        self._words[_W_SEQ] += 1

    def close(self, *, drop_rdma: bool) -> None:
        if self._words[_W_SEQ] % 2 == 0:
            self._words[_W_SEQ] += 1
        self._words[_W_STATE] = SlotState.CLOSED
        for rdma in self._rdma:
            if rdma is not None and drop_rdma:
                _rdma.drop(rdma)
        self._rdma = []
        if self.pinned:
            with suppress(Exception):
                _cudart().cudaHostUnregister(self.segment.data_ptr())
            self.pinned = False

    def pin(self) -> None:
        """Page-locks the segment for CUDA so device-to-host copies run asynchronously."""
        if not self.pinned:
            err = _cudart().cudaHostRegister(self.segment.data_ptr(), self.segment.numel(), 0)
            self.pinned = int(err) == 0


def _cudart() -> Any:
    return torch.cuda.cudart()  # type: ignore[no-untyped-call]
