"""The trainer's side of weight sync: copy a state dict into staging memory and return.

    publisher = Publisher()
    manifest = publisher.publish(model.state_dict(), version=step)   # one copy, then return
    # send `manifest` to generators; they `await pull(manifest, into=...)` meanwhile

`publish` blocks only for one copy of the weights into CPU staging memory (page-locked when
the weights are on CUDA); readers then pull from staging while the trainer trains on.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from rdma_tensor._owner import Control
from rdma_tensor._packing import TensorSpec, pack_buckets
from rdma_tensor.errors import (
    MismatchError,
    PublisherClosedError,
    SlotsBusyError,
    StaleVersionError,
)
from rdma_tensor.manifest import BucketLayout, Manifest, SlotRef, TensorEntry
from rdma_tensor.staging import MAX_BUCKETS, StagingSlot
from rdma_tensor.transport import Transport, transport_override


@dataclass(frozen=True)
class PublisherConfig:
    """How a `Publisher` stages weights.

    slots: staging slots (>= 2), each the size of the packed state dict. A slot is pinned
        while a same-machine reader uses it: for one copy (two for a pipelined copy), or,
        for a reader that maps its weights (`Subscriber` in map mode), until that reader
        moves to a newer version or unmaps. `publish` needs one unpinned slot, so with M
        mapping readers use slots >= M + 1 (the default 2 covers one); add one more if
        publishes come faster than a copying reader copies. Otherwise `publish` waits for
        a slot, up to `busy_timeout_s`, then raises `SlotsBusyError`.
    bucket_bytes: target bucket size in bytes. One bucket is one RDMA transfer, and the
        unit a waiting reader copies while the next one is being staged.
    transport: force readers onto one transport (None: `RDMA_TENSOR_TRANSPORT` or auto).
        CUDA_IPC is not allowed: staging memory is CPU memory.
    busy_timeout_s: how long `publish` waits, in seconds, if readers pin every slot,
        before raising `SlotsBusyError` (nothing staged; the latest version stays).
    """

    slots: int = 2
    bucket_bytes: int = 16 << 20
    transport: Transport | None = None
    busy_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if self.slots < 2:
            raise ValueError(f"slots must be >= 2 so publishing never waits, got {self.slots}")
        if self.bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be positive, got {self.bucket_bytes}")
        if self.busy_timeout_s < 0:
            raise ValueError(f"busy_timeout_s must be >= 0, got {self.busy_timeout_s}")
        if self.transport is Transport.CUDA_IPC:
            raise ValueError("staging memory is CPU memory: use shm, rdma or None, not cuda_ipc")


class Publisher:
    """Owns the staging slots of one stream of versions of one state dict (fixed names, shapes,
    dtypes and order)."""

    def __init__(self, config: PublisherConfig | None = None) -> None:
        self._closed = False
        self._control: Control | None = None
        self._slots: list[StagingSlot] = []
        self._slot_refs: tuple[SlotRef, ...] = ()
        self._bucket_layout: BucketLayout | None = None
        self._signature: list[tuple[str, torch.dtype, torch.Size]] | None = None
        self._latest: Manifest | None = None
        self.config = config or PublisherConfig()
        self.publisher_id = uuid.uuid4().hex
        self._forced = transport_override(self.config.transport, device="cpu")

    @property
    def latest(self) -> Manifest | None:
        """The manifest of the newest completed version, None before the first publish."""
        return self._latest

    def publish(self, state_dict: Mapping[str, torch.Tensor], version: int) -> Manifest:
        """Copies `state_dict` into a free staging slot as `version` and returns its manifest.

        The first call fixes the layout (names, shapes, dtypes, order) and allocates the
        slots. Raises `MismatchError` if a later state dict differs from that layout,
        `StaleVersionError` unless `version` exceeds the last one, `PublisherClosedError`
        after `close`, `SlotsBusyError` if readers pin every slot for `busy_timeout_s`
        (see `PublisherConfig.slots`); nothing is staged in those cases, and `latest` stays
        the previous version, so the same `version` can be published again later.
        """
        slot, manifest, tensors = self._begin(state_dict, version)
        self._write(slot, tensors)
        return self._commit(slot, manifest)

    def release(self, version: int) -> None:
        """Says every subscriber holds `version` or newer. A `Publisher` needs no such word,
        so this does nothing beyond checking `version`: it reuses a slot only when no
        same-machine reader leases it, and RDMA readers detect a rewritten slot and retry.

        It exists so that code driving either publisher (this one or
        `dtensor_reshard.ShardedPublisher`, whose staging is reused only after `release`)
        can call `publish(state, version)` then `release(version)` without asking which.
        """
        _check_version(version)

    def close(self) -> None:
        """Readers fail from now on; staging memory is freed once readers let go of it.

        Call it while Monarch is running in this process (e.g. from an endpoint): it
        unregisters the RDMA buffers, which sends a message to Monarch's RDMA manager.
        """
        self._close(drop_rdma=True)

    def __del__(self) -> None:
        # During interpreter or actor shutdown Monarch's RDMA manager may already be gone, and
        # a release sent to it fails loudly; registered memory is released at exit anyway.
        self._close(drop_rdma=False)

    def _close(self, *, drop_rdma: bool) -> None:
        if self._closed:
            return
        self._closed = True
        for slot in self._slots:
            slot.close(drop_rdma=drop_rdma)
        if self._control is not None:
            self._control.close()
        self._slots = []

    # The steps of `publish`, separate so tests can stop a publisher half-way.

    def _begin(
        self, state_dict: Mapping[str, torch.Tensor], version: int
    ) -> tuple[StagingSlot, Manifest, list[torch.Tensor]]:
        if self._closed:
            raise PublisherClosedError("publish() on a closed Publisher")
        tensors = self._check(state_dict, version)
        if not self._slots:
            self._allocate()
        assert self._bucket_layout is not None
        index = self._claim(version)
        slot = self._slots[index]
        manifest = Manifest(
            publisher_id=self.publisher_id,
            version=version,
            slot=index,
            bucket_layout=self._bucket_layout,
            slots=self._slot_refs,  # the same tuple every time: manifests pickle it once
        )
        return slot, manifest, tensors

    def _write(
        self,
        slot: StagingSlot,
        tensors: Sequence[torch.Tensor],
        buckets: Sequence[int] | None = None,
    ) -> None:
        """Copies the tensors in, bucket by bucket, marking each bucket as it completes so
        that waiting readers can start on it (`buckets`: only these, for tests)."""
        assert self._bucket_layout is not None
        on_cuda = any(t.is_cuda for t in tensors)
        if on_cuda:
            slot.pin()
        version = slot.version
        by_bucket: list[list[tuple[TensorEntry, torch.Tensor]]] = [[] for _ in slot.buckets]
        for entry, src in zip(self._bucket_layout.entries, tensors, strict=True):
            by_bucket[entry.bucket].append((entry, src))
        with torch.no_grad():
            for k, bucket in enumerate(slot.buckets):
                if buckets is not None and k not in buckets:
                    continue
                for entry, src in by_bucket[k]:
                    dst = bucket[entry.offset : entry.offset + entry.nbytes]
                    dst.view(entry.dtype).view(entry.shape).copy_(src, non_blocking=slot.pinned)
                if on_cuda:
                    torch.cuda.synchronize()
                slot.mark_bucket(k, version)

    def _commit(self, slot: StagingSlot, manifest: Manifest) -> Manifest:
        slot.complete()
        self._latest = manifest
        return manifest

    def _check(self, state_dict: object, version: object) -> list[torch.Tensor]:
        """Validates a publish call (typed `object`: callers are not always type-checked)."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict must be a mapping, got {type(state_dict).__name__}")
        _check_version(version)
        assert isinstance(version, int)
        if self._latest is not None and version <= self._latest.version:
            raise StaleVersionError(
                f"version {version} is not newer than the last published {self._latest.version}"
            )
        if not state_dict:
            raise MismatchError("cannot publish an empty state dict")
        problems = []
        tensors: dict[str, torch.Tensor] = {}
        for name, t in state_dict.items():
            if not isinstance(t, torch.Tensor):
                problems.append(f"{name}: not a tensor ({type(t).__name__})")
            elif t.device.type not in ("cpu", "cuda"):
                problems.append(f"{name}: on {t.device}; only cpu and cuda are supported")
            else:
                tensors[str(name)] = t
        if problems:
            raise MismatchError("cannot publish this state dict:\n  " + "\n  ".join(problems))
        signature = [(n, t.dtype, t.shape) for n, t in tensors.items()]
        if signature == self._signature:  # the common case, checked cheaply
            return list(tensors.values())
        specs = [TensorSpec(n, dtype, tuple(shape)) for n, dtype, shape in signature]
        if self._bucket_layout is None:
            layout = pack_buckets(specs, self.config.bucket_bytes)
            if len(layout.bucket_nbytes) > MAX_BUCKETS:
                raise MismatchError(
                    f"{len(layout.bucket_nbytes)} buckets exceed the {MAX_BUCKETS} a slot "
                    "header can track; raise PublisherConfig.bucket_bytes"
                )
            self._bucket_layout = layout
            self._signature = signature
        else:
            published = [TensorSpec(e.name, e.dtype, e.shape) for e in self._bucket_layout.entries]
            if specs != published:
                raise MismatchError(
                    "state dict differs from the layout fixed by the first publish: "
                    + _describe_difference(published, specs)
                    + "; use a new Publisher for a new layout"
                )
        return list(tensors.values())

    def _allocate(self) -> None:
        assert self._bucket_layout is not None
        self._control = Control()
        self._slots = [
            StagingSlot(self._bucket_layout, self._control.owner, self._forced)
            for _ in range(self.config.slots)
        ]
        self._slot_refs = tuple(s.ref for s in self._slots)

    def _claim(self, version: int) -> int:
        """A free slot, oldest version first; the newest complete version is kept if possible."""
        latest = self._latest.slot if self._latest is not None else -1
        order = sorted(range(len(self._slots)), key=lambda i: (i == latest, self._slots[i].version))
        deadline = time.monotonic() + self.config.busy_timeout_s
        while True:
            for i in order:
                if self._slots[i].try_claim(version):
                    return i
            if time.monotonic() > deadline:
                held = ", ".join(f"v{s.version}" for s in self._slots)
                raise SlotsBusyError(
                    f"all {len(self._slots)} staging slots ({held}) stayed leased by readers "
                    f"for {self.config.busy_timeout_s}s, so version {version} was not staged: "
                    "a reader that maps its weights pins its version's slot until it pulls a "
                    "newer one or unmaps; with M such readers use PublisherConfig(slots=M + 1)"
                )
            time.sleep(0.0005)


def _check_version(version: object) -> None:
    """Typed `object`: callers are not always type-checked."""
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise ValueError(f"version must be a non-negative int, got {version!r}")


def _describe_difference(before: list[TensorSpec], after: list[TensorSpec]) -> str:
    old, new = {s.name: s for s in before}, {s.name: s for s in after}
    missing = [n for n in old if n not in new]
    extra = [n for n in new if n not in old]
    if missing or extra:
        return f"missing {missing[:5]}, unexpected {extra[:5]}"
    for n, s in new.items():
        if s != old[n]:
            return f"{n} was {old[n].dtype} {list(old[n].shape)}, now {s.dtype} {list(s.shape)}"
    return "same tensors in a different order"
