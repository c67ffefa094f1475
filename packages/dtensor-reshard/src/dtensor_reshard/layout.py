"""`Layout`: how a DTensor's global tensor is cut into per-rank local shards.

The rules are exactly `torch.distributed.tensor`'s (torch 2.9+): mesh dimensions are applied
left to right; `Shard(d)` on a mesh dimension of size `n` splits the *current* local extent of
tensor dimension `d` like `torch.chunk` (chunks of `ceil(extent / n)`, so trailing ranks may
get a smaller or an empty chunk); `Replicate()` leaves it alone. Sharding the same tensor
dimension on two mesh dimensions therefore nests: the second split cuts each chunk of the
first. Every local shard is a box (contiguous index range per dimension) of the global tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod
from typing import TypeAlias

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard

from dtensor_reshard.box import Box
from dtensor_reshard.errors import ReshardError

Placement: TypeAlias = Shard | Replicate
"""The placements a `Layout` understands. `Partial` (pending reduction) and the private
`_StridedShard` are rejected: neither maps a rank to a box of the global tensor."""


def chunk_extent(size: int, num_chunks: int, index: int) -> tuple[int, int]:
    """(offset, length) of chunk `index` when `torch.chunk` splits `size` into `num_chunks`.

    Mirrors `Shard.local_shard_size_and_offset`: chunks of `ceil(size / num_chunks)`, clamped
    at the end, so the last chunks may be short or empty (an empty chunk sits at `size`).
    """
    full = -(-size // num_chunks)
    start = min(size, full * index)
    return start, max(0, min(size, start + full) - start)


def _normalize_placement(p: object, ndim: int) -> Placement:
    # _StridedShard is not a subclass of Shard in torch>=2.9, but check by exact type anyway so
    # any future subclass with non-box semantics is refused rather than silently mis-planned.
    if type(p) is Replicate:
        return p
    if type(p) is Shard:
        dim = p.dim
        if not -ndim <= dim < ndim:
            raise ReshardError(f"{p!r} is out of range for a {ndim}-dimensional tensor")
        return Shard(dim % ndim)
    raise ReshardError(
        f"unsupported placement {p!r}: a Layout accepts torch.distributed.tensor Shard(dim) "
        "and Replicate() only (Partial needs a reduction first; _StridedShard is not a box)"
    )


@dataclass(frozen=True)
class Layout:
    """A global tensor's shape and dtype, and how a device mesh shards it.

    Attributes:
        global_shape: shape of the full (logical) tensor, in elements.
        dtype: element type, identical on every rank.
        mesh_shape: the device mesh's shape; its ranks are numbered row-major (the rank of a
            mesh coordinate is its index in `torch.arange(prod(mesh_shape)).reshape(mesh_shape)`).
        placements: one `Shard(dim)` or `Replicate()` per mesh dimension; negative dims are
            normalized.
        world_ranks: optional, one per mesh rank: the process's rank in a process group that
            both meshes of a `plan(..., colocated=True)` share (what `DeviceMesh.mesh` holds).
            Only used to decide which bytes are already local; see `plan`.
    """

    global_shape: tuple[int, ...]
    dtype: torch.dtype
    mesh_shape: tuple[int, ...]
    placements: tuple[Placement, ...]
    world_ranks: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        shape = tuple(int(s) for s in self.global_shape)
        mesh = tuple(int(s) for s in self.mesh_shape)
        if any(s < 0 for s in shape):
            raise ReshardError(f"global_shape {shape} has a negative size")
        if not isinstance(self.dtype, torch.dtype):
            raise ReshardError(f"dtype must be a torch.dtype, got {self.dtype!r}")
        if not mesh or any(s < 1 for s in mesh):
            raise ReshardError(f"mesh_shape {mesh} must have at least one dimension, all >= 1")
        if len(self.placements) != len(mesh):
            raise ReshardError(
                f"{len(self.placements)} placements for a {len(mesh)}-dimensional mesh "
                f"{mesh}: give exactly one placement per mesh dimension"
            )
        placements = tuple(_normalize_placement(p, len(shape)) for p in self.placements)
        world = None if self.world_ranks is None else tuple(int(r) for r in self.world_ranks)
        if world is not None and (len(world) != prod(mesh) or len(set(world)) != len(world)):
            raise ReshardError(
                f"world_ranks {world} must list {prod(mesh)} distinct ranks, one per mesh rank"
            )
        object.__setattr__(self, "global_shape", shape)
        object.__setattr__(self, "mesh_shape", mesh)
        object.__setattr__(self, "placements", placements)
        object.__setattr__(self, "world_ranks", world)

    @classmethod
    def from_dtensor(cls, tensor: DTensor) -> Layout:
        """The layout of a live DTensor, checked against its local tensor's shape.

        `world_ranks` is taken from the device mesh (ranks in the DTensor's default process
        group), so two layouts from the same process group can be planned `colocated=True`.
        """
        if not isinstance(tensor, DTensor):
            raise ReshardError(f"expected a DTensor, got {type(tensor).__name__}")
        mesh = tensor.device_mesh
        layout = cls(
            global_shape=tuple(tensor.shape),
            dtype=tensor.dtype,
            mesh_shape=tuple(mesh.shape),
            placements=tuple(tensor.placements),  # type: ignore[arg-type]
            world_ranks=tuple(int(r) for r in mesh.mesh.flatten().tolist()),
        )
        coordinate = mesh.get_coordinate()
        if coordinate is not None:
            rank = layout.rank_of(tuple(coordinate))
            expected = layout.local_shape(rank)
            if tuple(tensor.to_local().shape) != expected:
                raise ReshardError(
                    f"DTensor local shard has shape {tuple(tensor.to_local().shape)}, but "
                    f"{layout.describe()} gives mesh rank {rank} the shape {expected}: "
                    "DTensors built by from_local with custom shapes are not supported"
                )
        return layout

    @property
    def num_ranks(self) -> int:
        return prod(self.mesh_shape)

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    def check_rank(self, rank: int, role: str = "mesh") -> int:
        if not 0 <= rank < self.num_ranks:
            raise ReshardError(
                f"{role} rank {rank} is outside the mesh {self.mesh_shape} "
                f"(valid ranks: 0..{self.num_ranks - 1})"
            )
        return rank

    def coordinate(self, rank: int) -> tuple[int, ...]:
        """The mesh coordinate of a (row-major) mesh rank."""
        self.check_rank(rank)
        coords = []
        for size in reversed(self.mesh_shape):
            coords.append(rank % size)
            rank //= size
        return tuple(reversed(coords))

    def rank_of(self, coordinate: Sequence[int]) -> int:
        if len(coordinate) != len(self.mesh_shape) or any(
            not 0 <= c < s for c, s in zip(coordinate, self.mesh_shape, strict=True)
        ):
            raise ReshardError(f"coordinate {tuple(coordinate)} is outside mesh {self.mesh_shape}")
        rank = 0
        for c, size in zip(coordinate, self.mesh_shape, strict=True):
            rank = rank * size + c
        return rank

    def local_box(self, rank: int) -> Box:
        """The global index box that mesh rank `rank` holds.

        Equal to torch's `compute_local_shape_and_global_offset` (an empty shard reports
        offset `global_shape[dim]` on its sharded dimension, as torch does).
        """
        coordinate = self.coordinate(rank)
        offsets = [0] * len(self.global_shape)
        sizes = list(self.global_shape)
        for mesh_dim, placement in enumerate(self.placements):
            if isinstance(placement, Shard):
                d = placement.dim
                n, index = self.mesh_shape[mesh_dim], coordinate[mesh_dim]
                start, length = chunk_extent(sizes[d], n, index)
                offsets[d] = offsets[d] + start if length > 0 else self.global_shape[d]
                sizes[d] = length
        return Box(tuple(offsets), tuple(sizes))

    def local_shape(self, rank: int) -> tuple[int, ...]:
        return self.local_box(rank).sizes

    def local_shard(self, rank: int, full: torch.Tensor) -> torch.Tensor:
        """Rank `rank`'s shard as a view of the full tensor (a reference implementation)."""
        if tuple(full.shape) != self.global_shape:
            raise ReshardError(f"full tensor shape {tuple(full.shape)} != {self.global_shape}")
        return self.local_box(rank).view(full)

    def describe(self) -> str:
        """A short human-readable form, e.g. `(8, 6) float32 on mesh (2, 2) [S(0), S(1)]`."""
        names = ", ".join(f"S({p.dim})" if isinstance(p, Shard) else "R" for p in self.placements)
        dtype = str(self.dtype).removeprefix("torch.")
        return f"{self.global_shape} {dtype} on mesh {self.mesh_shape} [{names}]"
