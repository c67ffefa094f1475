"""The generator's side of weight sync: apply a published version to existing tensors.

    result = await pull(manifest, into=model.state_dict())   # in place, all or nothing

`pull` checks `into` against the manifest before touching anything, waits until a version at
least as new as the manifest's is completely staged, and copies it into `into` in one go:

- same machine (shared memory): under a lease on the slot, straight from the publisher's
  mapped staging memory into `into` (one copy, no socket, no scratch). The lease keeps the
  publisher off that slot, so the copy cannot be torn, and the copy is a plain memory copy
  that cannot fail half-way, so `into` holds either the old or the new version;
- RDMA (other machines, or forced): buckets are read into scratch memory, the slot header is
  read again to prove no rewrite started meanwhile (else retry, possibly with a newer
  version), and only then copied into `into`.

If the publisher died, was closed, or the version does not arrive within `timeout`, `pull`
raises and `into` is unchanged.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from rdma_tensor import _shm
from rdma_tensor._owner import is_local
from rdma_tensor.errors import (
    MismatchError,
    PublisherClosedError,
    PublisherDiedError,
    PullTimeoutError,
    StaleVersionError,
    TransportError,
)
from rdma_tensor.handle import TensorHandle, check_owner, choose_transport
from rdma_tensor.manifest import Manifest, TensorEntry
from rdma_tensor.staging import HEADER_BYTES, SlotHeader, SlotState
from rdma_tensor.transport import Transport

if TYPE_CHECKING:
    from rdma_tensor.actors import WeightPublisher

Plan = list[tuple[TensorEntry, torch.Tensor]]

_WATCH_S = 0.05  # how often a waiting RDMA pull checks that a same-machine owner is alive


@dataclass(frozen=True)
class PullResult:
    """One `pull`: `version` is what `into` now holds.

    changed: False when `into` already held that version (nothing was copied).
    nbytes: bytes of tensor data copied into `into`.
    wait_seconds: time spent waiting for the version to be staged (and for a lease).
    copy_seconds: time spent moving bytes (RDMA reads included).
    seconds: wall time of the whole call.
    retries: reads thrown away because the publisher started rewriting the slot (RDMA).
    """

    version: int
    changed: bool
    transport: Transport
    nbytes: int
    wait_seconds: float
    copy_seconds: float
    seconds: float
    retries: int


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
    goal = _Goal(want, applied, deadline, timeout)
    if chosen is Transport.SHM:
        result = await _pull_shm(manifest, plan, goal)
    elif chosen is Transport.RDMA:
        result = await _pull_rdma(manifest, plan, goal)
    else:
        raise TransportError("staging memory is CPU memory: cuda_ipc cannot carry it")
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
    )


@dataclass(frozen=True)
class _Goal:
    """What a pull waits for: a complete version >= `want`, until `deadline` (monotonic)."""

    want: int
    applied: int | None
    deadline: float
    wait_s: float


@dataclass(frozen=True)
class _Outcome:
    version: int
    changed: bool
    nbytes: int
    copy_seconds: float
    retries: int = 0


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


def _copy(plan: Plan, buckets: list[torch.Tensor]) -> None:
    """Copies every entry from its bucket bytes into its destination (casting if needed)."""
    with torch.no_grad():
        for e, dst in plan:
            src = buckets[e.bucket][e.offset : e.offset + e.nbytes].view(e.dtype).view(e.shape)
            dst.copy_(src)
    devices = {dst.device for _, dst in plan if dst.is_cuda}
    for device in devices:
        torch.cuda.synchronize(device)


def _newest(headers: list[SlotHeader], want: int) -> int | None:
    """The slot holding the newest complete version >= want, if any."""
    best = None
    for i, h in enumerate(headers):
        if h.complete and h.version >= want and (best is None or h.version > headers[best].version):
            best = i
    return best


def _timeout_error(want: int, timeout: float, headers: list[SlotHeader]) -> PullTimeoutError:
    held = ", ".join(f"{h.state.name.lower()} v{h.version}" for h in headers)
    return PullTimeoutError(f"version >= {want} was not staged within {timeout}s (slots: {held})")


def _check_not_closed(headers: list[SlotHeader]) -> None:
    if any(h.state is SlotState.CLOSED for h in headers):
        raise PublisherClosedError("the publisher was closed")


async def _pull_shm(manifest: Manifest, plan: Plan, goal: _Goal) -> _Outcome:
    want, applied, deadline, wait_s = goal.want, goal.applied, goal.deadline, goal.wait_s
    owner = manifest.slots[0].header.owner
    check_owner(owner)
    slots = []
    for ref in manifest.slots:
        assert ref.header.shm is not None
        header, fd = _shm.local_view(owner.process, ref.header.shm)
        buckets = [_shm.local_view(owner.process, b.shm)[0] for b in ref.buckets if b.shm]
        slots.append((header, fd, buckets))
    backoff = 0.0002
    while True:
        check_owner(owner)
        headers = [SlotHeader.parse(h) for h, _, _ in slots]
        _check_not_closed(headers)
        best = _newest(headers, want)
        if best is not None:
            if headers[best].version == applied:
                return _Outcome(headers[best].version, False, 0, 0.0)
            header, fd, buckets = slots[best]
            if _shm.try_lock(fd, exclusive=False):
                try:
                    # Re-read under the lease: the publisher may have claimed it just before.
                    if SlotHeader.parse(header) == headers[best]:
                        t0 = time.perf_counter()
                        _copy(plan, buckets)
                        nbytes = sum(e.nbytes for e, _ in plan)
                        return _Outcome(
                            headers[best].version, True, nbytes, time.perf_counter() - t0
                        )
                finally:
                    _shm.unlock(fd)
        if time.monotonic() > deadline:
            raise _timeout_error(want, wait_s, headers)
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, 0.01)


async def _pull_rdma(manifest: Manifest, plan: Plan, goal: _Goal) -> _Outcome:
    want, applied, deadline, wait_s = goal.want, goal.applied, goal.deadline, goal.wait_s
    owner = manifest.slots[0].header.owner
    local = is_local(owner.process)

    async def read(handle: TensorHandle, dst: torch.Tensor) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise PullTimeoutError(f"version >= {want} did not arrive within {wait_s}s")
        transfer = asyncio.ensure_future(
            handle.read_into(dst, timeout=remaining, transport=Transport.RDMA)
        )
        try:
            # A transfer from a dead owner only ends at its timeout; on the owner's machine
            # we can see the death sooner and stop waiting.
            while not (await asyncio.wait({transfer}, timeout=_WATCH_S))[0]:
                if local:
                    check_owner(owner)
            transfer.result()
        except (PublisherClosedError, PublisherDiedError, PullTimeoutError):
            transfer.cancel()
            raise
        except Exception as e:
            if local:
                check_owner(owner)
            raise TransportError(
                f"RDMA read from the publisher on {owner.process.machine.hostname!r} failed "
                f"(closed, dead or unreachable): {e}"
            ) from e

    headers_raw = [torch.empty(HEADER_BYTES, dtype=torch.uint8) for _ in manifest.slots]
    scratch = [torch.empty(n, dtype=torch.uint8) for n in manifest.layout.bucket_nbytes]
    retries, backoff = 0, 0.001
    while True:
        if local:
            check_owner(owner)
        await asyncio.gather(
            *(read(s.header, h) for s, h in zip(manifest.slots, headers_raw, strict=True))
        )
        headers = [SlotHeader.parse(h) for h in headers_raw]
        _check_not_closed(headers)
        best = _newest(headers, want)
        if best is not None:
            if headers[best].version == applied:
                return _Outcome(headers[best].version, False, 0, 0.0, retries)
            ref = manifest.slots[best]
            t0 = time.perf_counter()
            await asyncio.gather(*(read(b, s) for b, s in zip(ref.buckets, scratch, strict=True)))
            await read(ref.header, headers_raw[best])
            if SlotHeader.parse(headers_raw[best]) == headers[best]:
                _copy(plan, scratch)
                nbytes = sum(e.nbytes for e, _ in plan)
                return _Outcome(
                    headers[best].version, True, nbytes, time.perf_counter() - t0, retries
                )
            retries += 1  # the publisher began rewriting that slot mid-read: discard, retry
            continue
        if time.monotonic() > deadline:
            raise _timeout_error(want, wait_s, headers)
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, 0.02)
