"""The data contracts of versioned sharded weight sync: one rank's part and the whole version.

    part = publisher.publish(state, version)    # each source rank: a ShardManifest
    manifest = merge(parts)                     # the controller: one ShardedManifest
    await pull(manifest, into=params)           # each destination

They play the part `rdma_tensor.Manifest` plays for an unsharded publisher: small, picklable,
sent in actor messages, while the bytes stay in the source processes until pulled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dtensor_reshard.errors import ReshardError
from dtensor_reshard.exports import SourceExport
from dtensor_reshard.layout import Layout


@dataclass(frozen=True)
class ShardManifest:
    """Source rank `rank`'s part of version `version`, as `ShardedPublisher.publish` returns it.

    Attributes:
        version: the version published (non-negative, increasing per publisher).
        rank: the source rank that published it (row-major rank in the source mesh).
        layouts: every tensor's source layout by name: global shape, dtype, mesh shape,
            placements (the same on every rank).
        destination: the layouts the version was planned toward, by name (by default one
            unsharded copy: a 1-rank mesh with `Replicate()`).
        export: this rank's staged pieces (see `SourceExport`).
    """

    version: int
    rank: int
    layouts: dict[str, Layout]
    destination: dict[str, Layout]
    export: SourceExport


@dataclass(frozen=True)
class ShardedManifest:
    """One version of a sharded state dict, every source rank's part: what a destination
    pulls (`dtensor_reshard.pull`). Build it with `merge`.

    Attributes:
        version, layouts, destination: as in `ShardManifest` (equal on every rank).
        exports: one `SourceExport` per source rank, in rank order (a few hundred bytes per
            tensor and rank; the bytes stay in the source processes until pulled).
    """

    version: int
    layouts: dict[str, Layout]
    destination: dict[str, Layout]
    exports: tuple[SourceExport, ...]

    @property
    def names(self) -> tuple[str, ...]:
        """The tensors' names, sorted."""
        return tuple(sorted(self.layouts))

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data in one full copy of the state dict."""
        total = 0
        for layout in self.layouts.values():
            numel = 1
            for size in layout.global_shape:
                numel *= size
            total += numel * layout.itemsize
        return total


def merge(parts: Sequence[ShardManifest]) -> ShardedManifest:
    """Every source rank's `ShardManifest` of one version -> the version's `ShardedManifest`.

    Raises `ReshardError` when `parts` is empty, the parts disagree on the version, the
    source layouts or the destination layouts, or a source rank is missing or appears twice.
    """
    parts = list(parts)
    if not parts:
        raise ReshardError("merge() needs one ShardManifest per source rank, got none")
    for part in parts:
        if not isinstance(part, ShardManifest):
            raise TypeError(f"merge() takes ShardManifests, got {type(part).__name__}")
    first = parts[0]
    versions = sorted({p.version for p in parts})
    if len(versions) > 1:
        raise ReshardError(f"source ranks published different versions: {versions}")
    for part in parts[1:]:
        for what in ("layouts", "destination"):
            mine, theirs = getattr(first, what), getattr(part, what)
            if mine != theirs:
                raise ReshardError(
                    f"source ranks {first.rank} and {part.rank} disagree on the {what}: "
                    + _difference(mine, theirs)
                )
    ranks = sorted(p.rank for p in parts)
    expected = next(iter(first.layouts.values())).num_ranks
    if ranks != list(range(expected)):
        raise ReshardError(
            f"need exactly one ShardManifest per source rank 0..{expected - 1}, got ranks {ranks}"
        )
    return ShardedManifest(
        version=first.version,
        layouts=first.layouts,
        destination=first.destination,
        exports=tuple(p.export for p in sorted(parts, key=lambda p: p.rank)),
    )


def _difference(a: dict[str, Layout], b: dict[str, Layout]) -> str:
    only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    if only_a or only_b:
        return f"tensors only in the first {only_a[:5]}, only in the second {only_b[:5]}"
    name = next(n for n in sorted(a) if a[n] != b[n])
    return f"{name!r} is {a[name].describe()} against {b[name].describe()}"
