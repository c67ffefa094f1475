"""`pull`: one destination takes a `ShardedManifest`'s version, all or nothing.

    result = await pull(manifest, into=dict(model.named_parameters()))

The same shape as `rdma_tensor.pull`. It checks `into` against the manifest, reads exactly
this destination's pieces from every source rank into staging buffers, and copies them into
`into` only once every piece has arrived and been checked, so a failed pull (a dead source,
a released version) leaves `into` untouched. Plans and staging buffers are kept for the next
pull in this process (staging: one set per recent (plan, destination rank, device), at most
`MAX_STAGING_SETS` sets; each is one destination shard's worth, in the sources' dtypes).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from rdma_tensor import Transport
from torch.distributed.tensor import DTensor

from dtensor_reshard.errors import ReshardError
from dtensor_reshard.manifest import ShardedManifest
from dtensor_reshard.plan_pull import pull_plan
from dtensor_reshard.reshard_plan import PlanCache, ReshardPlan

MAX_STAGING_SETS = 2

_plans = PlanCache()
_StagingKey = tuple[str, int, torch.device]
_staging: OrderedDict[_StagingKey, dict[str, torch.Tensor]] = OrderedDict()


@dataclass(frozen=True)
class ShardedPullResult:
    """One `pull` of a `ShardedManifest`: `version` is what `into` now holds.

    Attributes:
        version: the manifest's version.
        nbytes: bytes of tensor data this destination received (its shards, in the
            sources' dtypes, before any cast).
        bytes_read: bytes copied out of the source processes' staging (equal to `nbytes`:
            no byte is read twice).
        reads: staging-buffer reads issued (one per source rank and dtype it reads from).
        seconds: wall time of the whole call, checks included.
        transports: how the bytes came, chosen per source rank (`rdma_tensor.Transport`:
            `SHM` from sources on this machine, `RDMA` from sources on others).
    """

    version: int
    nbytes: int
    bytes_read: int
    reads: int
    seconds: float
    transports: frozenset[Transport] = frozenset()


async def pull(
    source: ShardedManifest,
    *,
    into: Mapping[str, torch.Tensor],
    dst_rank: int = 0,
    allow_cast: bool = False,
) -> ShardedPullResult:
    """Copies version `source.version` into `into`, in place, all or nothing.

    source: the `ShardedManifest` from `merge` of every source rank's `ShardManifest`.
    into: destination rank `dst_rank`'s tensors by name (plain tensors or DTensors, CPU or
        CUDA, any strides), exactly the published names, each of the local shape the
        destination layout gives `dst_rank` (with the default destination, one unsharded
        copy: the global shape), and the published dtype unless `allow_cast` (floating point
        to floating point only, e.g. float32 -> bfloat16).
    dst_rank: this destination's rank in the destination layouts' mesh.

    Raises `ReshardError` (naming the tensor) for names, shapes and dtypes that do not fit,
    and a rank outside the destination mesh; rdma-tensor's `PublisherClosedError` /
    `PublisherDiedError` when a source closed or died, and `StaleVersionError` when the
    version was released by the sources and its staging reused. On any error `into` is
    unchanged.
    """
    began = time.perf_counter()
    if not isinstance(source, ShardedManifest):
        raise TypeError(
            f"source must be a ShardedManifest (merge the ranks' parts), got "
            f"{type(source).__name__}"
        )
    plan = _plans.get(source.layouts, source.destination)
    targets = _check_into(plan, into, dst_rank, allow_cast)
    key = (plan.fingerprint, dst_rank, next(iter(targets.values())).device)
    staging = _take_staging(key, plan, dst_rank)
    try:
        stats = await pull_plan(plan, dst_rank, source.exports, staging)
        # Every piece arrived and was checked: install them with no await in between, so no
        # other coroutine of this process sees a mix of versions.
        with torch.no_grad():
            for name, target in targets.items():
                target.copy_(staging[name])
    finally:
        _give_back(key, staging)
    nbytes = sum(t.numel() * t.element_size() for t in staging.values())
    return ShardedPullResult(
        source.version,
        nbytes,
        stats.bytes_read,
        stats.reads,
        time.perf_counter() - began,
        stats.transports,
    )


def _check_into(
    plan: ReshardPlan, into: Mapping[str, torch.Tensor], dst_rank: int, allow_cast: bool
) -> dict[str, torch.Tensor]:
    """`into`'s local tensors by name, checked against the plan (raises `ReshardError`)."""
    if not isinstance(into, Mapping):
        raise TypeError(f"into must be a mapping of tensors, got {type(into).__name__}")
    missing = sorted(set(plan.names) - set(into))
    extra = sorted(set(into) - set(plan.names))
    if missing or extra:
        raise ReshardError(
            f"into does not match the published tensors: missing from into {missing[:5]}, "
            f"not published {extra[:5]}"
        )
    plan.plans[0][1].dst.check_rank(dst_rank, "destination")
    shapes = plan.local_shapes(dst_rank, "destination")
    problems = []
    targets: dict[str, torch.Tensor] = {}
    for name, p in plan.plans:
        src, dst, want = p.src, p.dst, shapes[name]
        tensor: object = into[name]  # `object`: callers are not always type-checked
        if not isinstance(tensor, torch.Tensor):
            problems.append(f"{name}: not a tensor ({type(tensor).__name__})")
            continue
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        if tuple(local.shape) != want:
            whole = "" if want == src.global_shape else f" of the published {src.global_shape}"
            problems.append(
                f"{name}: shape {list(local.shape)}, destination rank {dst_rank} holds "
                f"{list(want)}{whole} ({dst.describe()})"
            )
        elif local.dtype != src.dtype and not (
            allow_cast and local.dtype.is_floating_point and src.dtype.is_floating_point
        ):
            hint = "; pass allow_cast=True to convert" if not allow_cast else ""
            problems.append(f"{name}: dtype {local.dtype}, published {src.dtype}{hint}")
        elif local.device.type not in ("cpu", "cuda"):
            problems.append(f"{name}: on {local.device}; only cpu and cuda are supported")
        else:
            targets[name] = local
    if problems:
        raise ReshardError("cannot pull into these tensors:\n  " + "\n  ".join(problems))
    devices = {t.device for t in targets.values()}
    if len(devices) > 1:
        raise ReshardError(f"into's tensors are on several devices {sorted(map(str, devices))}")
    return targets


def _take_staging(key: _StagingKey, plan: ReshardPlan, dst_rank: int) -> dict[str, torch.Tensor]:
    """A free staging set for `key` (taken out, so a concurrent pull allocates its own)."""
    cached = _staging.pop(key, None)
    if cached is not None:
        return cached
    shapes = plan.local_shapes(dst_rank, "destination")
    return {
        name: torch.empty(shapes[name], dtype=p.src.dtype, device=key[2]) for name, p in plan.plans
    }


def _give_back(key: _StagingKey, staging: dict[str, torch.Tensor]) -> None:
    _staging[key] = staging
    _staging.move_to_end(key)
    while len(_staging) > MAX_STAGING_SETS:
        _staging.popitem(last=False)
