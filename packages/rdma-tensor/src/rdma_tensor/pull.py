"""The generator's side of weight sync: apply a published version to existing tensors.

    result = await pull(manifest, into=model.state_dict())   # in place, all or nothing

`pull` checks `into` against the manifest before touching anything, then waits for a version
at least as new as the manifest's and applies the newest one:

- same machine (shared memory, `_pull_shm`): straight from the publisher's mapped staging
  memory into `into` (one copy, no socket, no scratch), under a lease that keeps the
  publisher off that slot. A version still being staged is copied bucket by bucket as it
  arrives when the previous version can restore `into` if the new one stops arriving;
- RDMA (other machines, or forced, `_pull_rdma`): buckets are read into scratch memory and
  verified (the slot was not rewritten meanwhile, else retry) before they go into `into`.

If the publisher died, was closed, or the version does not arrive within `timeout`, `pull`
raises and `into` holds what it held before.

Run concurrent pulls into the same tensors one at a time (e.g. from one actor endpoint).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from rdma_tensor._pull_rdma import pull_rdma
from rdma_tensor._pull_shm import pull_shm
from rdma_tensor._pulling import Goal, Plan
from rdma_tensor.errors import (
    MismatchError,
    PublisherClosedError,
    PublisherDiedError,
    StaleVersionError,
    TransportError,
)
from rdma_tensor.handle import choose_transport, forget_owner
from rdma_tensor.manifest import Manifest
from rdma_tensor.transport import Transport

if TYPE_CHECKING:
    from rdma_tensor.actors import WeightPublisher


@dataclass(frozen=True)
class PullResult:
    """One `pull`: `version` is what `into` now holds.

    changed: False when `into` already held that version (nothing was copied).
    nbytes: bytes of tensor data copied into `into`.
    wait_seconds: time spent waiting for the version to be staged (and for a lease).
    copy_seconds: time spent moving bytes (RDMA reads included).
    seconds: wall time of the whole call.
    retries: reads thrown away because the publisher started rewriting the slot (RDMA).
    pipelined: whether buckets were copied while the publisher was still staging the rest
        (then `copy_seconds` includes waiting for them).
    """

    version: int
    changed: bool
    transport: Transport
    nbytes: int
    wait_seconds: float
    copy_seconds: float
    seconds: float
    retries: int
    pipelined: bool


# The version each destination last received from each publisher, in this process: the key
# is the publisher and the exact memory of every destination tensor.
_applied: dict[tuple[str, tuple[tuple[str, int, str], ...]], int] = {}


async def pull(
    source: Manifest | WeightPublisher,
    *,
    into: Mapping[str, torch.Tensor],
    allow_cast: bool = False,
    min_version: int | None = None,
    timeout: float = 60.0,  # noqa: ASYNC109 - bounds waiting for the version, not one await
    transport: Transport | None = None,
) -> PullResult:
    """Applies the newest completely staged version >= the manifest's to `into`, in place.

    source: a `Manifest` from `Publisher.publish`, or a `WeightPublisher` actor (its latest
        manifest is fetched).
    into: the destination state dict (CPU or CUDA tensors; any strides). It must have
        exactly the published names and shapes, and the same dtypes unless `allow_cast`
        (floating point to floating point only, e.g. float32 -> bfloat16).
    min_version: wait for at least this version (default: the manifest's).
    timeout: seconds to wait for the version before raising `PullTimeoutError`.
    transport: force a transport (default: the publisher's choice, else auto).

    Raises `MismatchError` for names/shapes/dtypes that do not fit, `StaleVersionError` when
    the version asked for is older than the one `into` already holds, `PublisherClosedError` /
    `PublisherDiedError` when the publisher closed or died, `PullTimeoutError`. On any error
    `into` is unchanged.
    """
    start = time.perf_counter()
    manifest = source if isinstance(source, Manifest) else await source.latest_manifest.call_one()
    plan = _plan(manifest, into, allow_cast)
    key = (manifest.publisher_id, tuple((e.name, t.data_ptr(), str(t.device)) for e, t in plan))
    applied = _applied.get(key)
    want = max(manifest.version, min_version if min_version is not None else 0)
    if applied is not None and want < applied:
        raise StaleVersionError(
            f"asked for version {want}, older than version {applied} already applied to "
            "these tensors"
        )
    chosen = choose_transport(manifest.slots[0].header, transport)
    deadline = time.monotonic() + timeout
    goal = Goal(want, applied, deadline, timeout)
    try:
        if chosen is Transport.SHM:
            result = await pull_shm(manifest, plan, goal)
        elif chosen is Transport.RDMA:
            result = await pull_rdma(manifest, plan, goal)
        else:
            raise TransportError("staging memory is CPU memory: cuda_ipc cannot carry it")
    except (PublisherClosedError, PublisherDiedError):
        forget_owner(manifest.slots[0].header.owner)  # let the kernel free its memory
        raise
    _applied[key] = result.version
    seconds = time.perf_counter() - start
    return PullResult(
        version=result.version,
        changed=result.changed,
        transport=chosen,
        nbytes=result.nbytes,
        wait_seconds=max(0.0, seconds - result.copy_seconds),
        copy_seconds=result.copy_seconds,
        seconds=seconds,
        retries=result.retries,
        pipelined=result.pipelined,
    )


def _plan(manifest: Manifest, into: Mapping[str, torch.Tensor], allow_cast: bool) -> Plan:
    """Pairs every manifest entry with its destination; lists every misfit at once."""
    if not isinstance(into, Mapping):
        raise TypeError(f"into must be a mapping of name to tensor, got {type(into).__name__}")
    entries = manifest.layout.entries
    problems = []
    missing = [e.name for e in entries if e.name not in into]
    extra = [n for n in into if n not in {e.name for e in entries}]
    if missing:
        problems.append(f"missing from into: {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    if extra:
        problems.append(f"not published: {extra[:8]}{' ...' if len(extra) > 8 else ''}")
    plan: Plan = []
    for e in entries:
        value: object = into.get(e.name)
        if value is None:
            continue
        if not isinstance(value, torch.Tensor):
            problems.append(f"{e.name}: not a tensor ({type(value).__name__})")
            continue
        dst = value
        if tuple(dst.shape) != e.shape:
            problems.append(f"{e.name}: shape {list(dst.shape)}, published {list(e.shape)}")
        if dst.dtype != e.dtype and not (
            allow_cast and dst.dtype.is_floating_point and e.dtype.is_floating_point
        ):
            hint = "" if allow_cast else " (allow_cast=True converts floating point)"
            problems.append(f"{e.name}: dtype {dst.dtype}, published {e.dtype}{hint}")
        if dst.device.type not in ("cpu", "cuda"):
            problems.append(f"{e.name}: on {dst.device}; only cpu and cuda are supported")
        plan.append((e, dst))
    if problems:
        raise MismatchError(
            f"into does not fit version {manifest.version} of the published state dict:\n  "
            + "\n  ".join(problems)
        )
    return plan
