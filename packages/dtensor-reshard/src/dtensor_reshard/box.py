"""`Box`: an axis-aligned, half-open block of a tensor's index space."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import torch


@dataclass(frozen=True)
class Box:
    """The block `[offsets[i], offsets[i] + sizes[i])` on every dimension `i`.

    Coordinates are element indices; whether they are global (into the full tensor) or local
    (into one rank's shard) depends on where the box is used and is said there. A box with a
    zero size on any dimension is empty.
    """

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.offsets) != len(self.sizes):
            raise ValueError(f"Box offsets {self.offsets} and sizes {self.sizes} differ in rank")
        if any(s < 0 for s in self.sizes) or any(o < 0 for o in self.offsets):
            raise ValueError(f"Box needs non-negative offsets and sizes, got {self}")

    @property
    def ndim(self) -> int:
        return len(self.sizes)

    @property
    def numel(self) -> int:
        return prod(self.sizes)

    @property
    def ends(self) -> tuple[int, ...]:
        return tuple(o + s for o, s in zip(self.offsets, self.sizes, strict=True))

    def intersect(self, other: Box) -> Box | None:
        """The common part of two boxes of the same rank, or None when it is empty."""
        lo = tuple(max(a, b) for a, b in zip(self.offsets, other.offsets, strict=True))
        hi = tuple(min(a, b) for a, b in zip(self.ends, other.ends, strict=True))
        if any(h <= low for low, h in zip(lo, hi, strict=True)):
            return None
        return Box(lo, tuple(h - low for low, h in zip(lo, hi, strict=True)))

    def relative_to(self, origin: Box) -> Box:
        """This box in the coordinates of `origin` (which must contain it)."""
        if self.intersect(origin) != self and self.numel > 0:
            raise ValueError(f"{self} is not inside {origin}")
        offsets = tuple(a - b for a, b in zip(self.offsets, origin.offsets, strict=True))
        return Box(offsets, self.sizes)

    def slices(self) -> tuple[slice, ...]:
        return tuple(slice(o, o + s) for o, s in zip(self.offsets, self.sizes, strict=True))

    def view(self, tensor: torch.Tensor) -> torch.Tensor:
        """The box as a view of `tensor` (no copy; usually not contiguous)."""
        return tensor[self.slices()]

    def __str__(self) -> str:
        spans = (f"{o}:{o + s}" for o, s in zip(self.offsets, self.sizes, strict=True))
        return "[" + ", ".join(spans) + "]"
