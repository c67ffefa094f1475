"""`ShardedPublisher`: versioned weight sync from a sharded trainer, one per source rank.

The same shape as `rdma_tensor.Publisher`, for a state dict of DTensors:

    publisher = ShardedPublisher(rank)                  # on each trainer rank
    part = publisher.publish(model_state, version)      # stages a snapshot, returns at once
    ...                                                 # the controller: merge(parts) -> pull
    publisher.release(version)                          # every destination holds >= version

`publish` packs exactly the pieces the destinations need into staging buffers (a snapshot:
the trainer trains on while destinations read), planned from the tensors' layouts toward the
destination layouts (by default one unsharded copy) with cached plans. Staging of a version
is reused only after `release` covers it, so it grows by one snapshot per version that is
published and not yet released.
"""

from __future__ import annotations

from collections.abc import Mapping

from rdma_tensor import PublisherClosedError, StaleVersionError, Transport
from torch.distributed.tensor import DTensor, Replicate

from dtensor_reshard.errors import ReshardError
from dtensor_reshard.exports import SourceExport
from dtensor_reshard.layout import Layout
from dtensor_reshard.manifest import ShardManifest
from dtensor_reshard.plan_publisher import PlanPublisher
from dtensor_reshard.reshard_plan import PlanCache


def _check_non_negative(what: str, value: object) -> None:
    """Typed `object`: callers are not always type-checked."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{what} must be a non-negative int, got {value!r}")


def one_unsharded_copy(layouts: Mapping[str, Layout]) -> dict[str, Layout]:
    """The destination layouts of one unsharded copy of `layouts`: the same names, shapes and
    dtypes on a 1-rank mesh with `Replicate()` (a generator holding whole tensors)."""
    return {
        name: Layout(src.global_shape, src.dtype, mesh_shape=(1,), placements=(Replicate(),))
        for name, src in layouts.items()
    }


class ShardedPublisher:
    """Publishes source rank `rank`'s shards of a DTensor state dict, version after version.

    Args:
        rank: this process's rank in the DTensors' device mesh (row-major; with a 1-D mesh
            over the default process group, `torch.distributed.get_rank()`).
        destination: the destination layouts by name (every published tensor's name); None
            plans toward one unsharded copy (`one_unsharded_copy`).
        transport: forces rdma-tensor's transport (else `RDMA_TENSOR_TRANSPORT`, else auto:
            shared memory on one machine, RDMA across machines).
    """

    def __init__(
        self,
        rank: int,
        *,
        destination: Mapping[str, Layout] | None = None,
        transport: Transport | None = None,
    ) -> None:
        _check_non_negative("rank", rank)
        self.rank = rank
        self._destination = None if destination is None else dict(destination)
        self._plans = PlanCache()
        self._exports = PlanPublisher(rank, staged=True, transport=transport)
        self._live: dict[int, SourceExport] = {}
        self._latest: ShardManifest | None = None
        self._closed = False
        # Reading a layout off a DTensor costs ~0.1 ms (hundreds of parameters: tens of ms
        # per publish), so each name keeps its last one while shape, dtype, placements and
        # mesh stay the same; so does the whole mapping and its destination.
        self._seen: dict[str, tuple[tuple[object, ...], Layout]] = {}
        self._last: tuple[dict[str, Layout], dict[str, Layout]] | None = None

    @property
    def latest(self) -> ShardManifest | None:
        """The newest published part, None before the first publish."""
        return self._latest

    def publish(self, state: Mapping[str, DTensor], version: int) -> ShardManifest:
        """Stages this rank's pieces of `state` (a snapshot) as `version` and returns its part.

        Raises, with nothing staged: `StaleVersionError` unless `version` exceeds the last
        one, `ValueError` for a negative or non-int version, `PublisherClosedError` after
        `close`, `ReshardError` when `state` is empty, holds a non-DTensor, a DTensor this
        rank does not hold rank `rank` of, or names other than the destination's.
        """
        if self._closed:
            raise PublisherClosedError("publish() on a closed ShardedPublisher")
        _check_non_negative("version", version)
        if self._latest is not None and version <= self._latest.version:
            raise StaleVersionError(
                f"version {version} is not newer than the last published {self._latest.version}"
            )
        layouts = self._layouts(state)
        if self._last is not None and self._last[0] is layouts:
            destination = self._last[1]
        else:
            destination = self._destination or one_unsharded_copy(layouts)
            self._last = (layouts, destination)
        plan = self._plans.get(layouts, destination)
        export = self._exports.publish(plan, state)
        self._live[version] = export
        self._latest = ShardManifest(version, self.rank, layouts, destination, export)
        return self._latest

    def release(self, version: int) -> None:
        """Says every destination holds `version` or newer: the staging of every version up to
        it may be packed again by later publishes. A pull of a released version still works
        until its staging is reused, then raises `StaleVersionError` (never mixed data)."""
        _check_non_negative("version", version)
        for v in sorted(v for v in self._live if v <= version):
            self._exports.release(self._live.pop(v))

    def close(self) -> None:
        """Frees every staging buffer; pulls of any version fail from now on."""
        self._closed = True
        self._live.clear()
        self._exports.close()

    def _layouts(self, state: Mapping[str, DTensor]) -> dict[str, Layout]:
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a mapping of DTensors, got {type(state).__name__}")
        if not state:
            raise ReshardError("cannot publish an empty state dict")
        layouts = {}
        unchanged = self._last is not None and len(state) == len(self._last[0])
        for name, tensor in state.items():
            if not isinstance(tensor, DTensor):
                raise ReshardError(
                    f"{name!r} is a {type(tensor).__name__}, not a DTensor: ShardedPublisher "
                    "reads each tensor's layout off its DTensor (use rdma_tensor.Publisher "
                    "for an unsharded state dict)"
                )
            key = (tensor.shape, tensor.dtype, tensor.placements, tensor.device_mesh)
            seen = self._seen.get(str(name))
            if seen is not None and seen[0] == key:
                layouts[str(name)] = seen[1]
                continue
            unchanged = False
            layout = Layout.from_dtensor(tensor)
            coordinate = tensor.device_mesh.get_coordinate()
            held = None if coordinate is None else layout.rank_of(tuple(coordinate))
            if held != self.rank:
                raise ReshardError(
                    f"{name!r}: this process holds mesh rank {held} of it, but the publisher "
                    f"was made for rank {self.rank}"
                )
            layouts[str(name)] = layout
            self._seen[str(name)] = (key, layout)
        if unchanged and self._last is not None and layouts.keys() == self._last[0].keys():
            return self._last[0]
        return layouts
