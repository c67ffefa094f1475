"""Pulling on the publisher's machine: straight out of the mapped staging slots.

Two ways to apply a complete version:

- copy: the version is copied into the caller's tensors under a shared `flock` lease on its
  slot, which keeps the publisher from claiming that slot meanwhile; the copy is a plain
  memory copy, so it cannot fail half-way and `into` goes from the old version to the new
  one in one step;
- map (`map_views=True`): nothing is copied. The slot is leased by tensors viewing it (see
  `_lease`): the lease lasts as long as any of them lives, and the caller swaps them in.

A version still being staged is copied *pipelined* (copy only) when `into` holds a version
that is still complete in another slot: bucket k is copied as soon as the publisher marks it
written, while it writes bucket k+1. Both slots are leased for the duration; if the new
version stops arriving (publisher dead, closed, timeout) the buckets already copied are
restored from the old version's slot, so `into` is back to exactly the old version before
the error is raised. The pipelined copy blocks this process's event loop (so no other
coroutine sees `into` half updated); if the next bucket is not staged within `_STALL_S` it
also restores the old version and goes back to waiting, without blocking, for the version to
complete.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass

import torch

from rdma_tensor import _shm
from rdma_tensor._owner import Owner
from rdma_tensor._pulling import (
    Goal,
    Outcome,
    Plan,
    check_not_closed,
    copy_entries,
    newest,
    plan_bytes,
    timeout_error,
)
from rdma_tensor.errors import PullTimeoutError
from rdma_tensor.handle import check_owner
from rdma_tensor.manifest import Manifest
from rdma_tensor.staging import HEADER_BYTES, SlotHeader, SlotState, bucket_version

_POLL_S = 0.0003  # pipelined copy: how long to sleep while the next bucket is being staged
_STALL_S = 1.0  # pipelined copy: longest wait for one bucket before giving up on pipelining


@dataclass
class Stats:
    """Counters of this process's pipelined pulls (tests read them)."""

    pipelined: int = 0
    rollbacks: int = 0


STATS = Stats()


class _Stalled(Exception):
    """The publisher stopped staging buckets for a while: wait for it without blocking."""


@dataclass(frozen=True)
class _Slot:
    """A staging slot as mapped here: header bytes, lease descriptor, bucket bytes."""

    header: torch.Tensor
    fd: int
    buckets: list[torch.Tensor]

    def read_header(self) -> SlotHeader:
        return SlotHeader.parse(self.header)


def _map(manifest: Manifest, *, for_cuda: bool) -> list[_Slot]:
    process = manifest.slots[0].header.owner.process
    slots = []
    for ref in manifest.slots:
        assert ref.header.shm is not None
        header, fd = _shm.local_view(process, ref.header.shm, for_cuda=for_cuda)
        buckets = [
            _shm.local_view(process, b.shm, for_cuda=for_cuda)[0] for b in ref.buckets if b.shm
        ]
        slots.append(_Slot(header, fd, buckets))
    return slots


async def pull_shm(manifest: Manifest, plan: Plan, goal: Goal, *, map_views: bool) -> Outcome:
    """Waits for a complete version >= `goal.want`, then copies it into `plan`'s tensors or,
    with `map_views`, returns leased views of it (`Outcome.views`, nothing copied)."""
    owner = manifest.slots[0].header.owner
    check_owner(owner)
    slots = _map(manifest, for_cuda=not map_views and any(dst.is_cuda for _, dst in plan))
    backoff = 0.0002
    pipeline = True
    while True:
        check_owner(owner)
        headers = [s.read_header() for s in slots]
        check_not_closed(headers)
        outcome = None
        best = newest(headers, goal.want, SlotState.COMPLETE)
        if best is not None:
            if headers[best].version == goal.applied:
                return Outcome(headers[best].version, False, 0, 0.0)
            if map_views:
                outcome = _lease_complete(manifest, best, headers[best], plan)
            else:
                outcome = _copy_complete(slots[best], headers[best], plan)
        elif not map_views:
            staging = newest(headers, goal.want, SlotState.WRITING)
            old = next(
                (i for i, h in enumerate(headers) if h.complete and h.version == goal.applied),
                None,
            )
            if pipeline and staging is not None and old is not None:
                pair = (slots[staging], headers[staging], slots[old], headers[old])
                try:
                    outcome = _copy_pipelined(*pair, plan=plan, owner=owner, goal=goal)
                except _Stalled:
                    pipeline = False
        if outcome is not None:
            return outcome
        if time.monotonic() > goal.deadline:
            raise timeout_error(goal, headers)
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, 0.002)


def _copy_complete(slot: _Slot, seen: SlotHeader, plan: Plan) -> Outcome | None:
    """Copies a complete version under a lease; None if the publisher got there first."""
    if not _shm.try_lock(slot.fd, exclusive=False):
        return None
    try:
        # Re-read under the lease: the publisher may have claimed the slot just before.
        if slot.read_header() != seen:
            return None
        t0 = time.perf_counter()
        copy_entries(plan, slot.buckets)
        return Outcome(seen.version, True, plan_bytes(plan), time.perf_counter() - t0)
    finally:
        _shm.unlock(slot.fd)


def _lease_complete(manifest: Manifest, index: int, seen: SlotHeader, plan: Plan) -> Outcome | None:
    """Leases a complete version and returns views of it; None if the publisher got there
    first (then the lease is dropped at once with the views)."""
    ref = manifest.slots[index]
    assert ref.header.shm is not None
    t0 = time.perf_counter()
    whole = dataclasses.replace(ref.header.shm, byte_offset=0, nbytes=ref.header.shm.file_nbytes)
    leased = _shm.lease(ref.header.owner.process, whole)
    # Re-read under the lease: the publisher may have claimed the slot just before.
    if leased is None or SlotHeader.parse(leased[:HEADER_BYTES]) != seen:
        return None
    starts = [b.shm.byte_offset for b in ref.buckets if b.shm is not None]
    views = {
        e.name: leased[starts[e.bucket] + e.offset : starts[e.bucket] + e.offset + e.nbytes]
        .view(e.dtype)
        .view(e.shape)
        for e, _ in plan
    }
    elapsed = time.perf_counter() - t0
    return Outcome(seen.version, True, plan_bytes(plan), elapsed, views=views)


def _copy_pipelined(
    new: _Slot,
    new_seen: SlotHeader,
    old: _Slot,
    old_seen: SlotHeader,
    *,
    plan: Plan,
    owner: Owner,
    goal: Goal,
) -> Outcome | None:
    """Copies a version bucket by bucket as it is staged (see the module docstring)."""
    if not _shm.try_lock(old.fd, exclusive=False):
        return None
    try:
        if old.read_header() != old_seen or not _shm.try_lock(new.fd, exclusive=False):
            return None
        try:
            now = new.read_header()
            if now.version != new_seen.version or now.state not in (
                SlotState.WRITING,
                SlotState.COMPLETE,
            ):
                return None
            t0 = time.perf_counter()
            _copy_buckets(new, now.version, old, plan=plan, owner=owner, goal=goal)
            elapsed = time.perf_counter() - t0
            return Outcome(now.version, True, plan_bytes(plan), elapsed, pipelined=True)
        finally:
            _shm.unlock(new.fd)
    finally:
        _shm.unlock(old.fd)


def _copy_buckets(
    new: _Slot, version: int, old: _Slot, *, plan: Plan, owner: Owner, goal: Goal
) -> None:
    by_bucket: list[Plan] = [[] for _ in new.buckets]
    for e, dst in plan:
        by_bucket[e.bucket].append((e, dst))
    done: Plan = []
    try:
        for k, part in enumerate(by_bucket):
            stall = time.monotonic() + _STALL_S
            while bucket_version(new.header, k) != version:
                time.sleep(_POLL_S)
                check_owner(owner)  # raises once the publisher died or closed
                if time.monotonic() > goal.deadline:
                    raise PullTimeoutError(
                        f"version {version} stopped arriving: bucket {k} of {len(by_bucket)} "
                        f"was not staged within {goal.wait_s}s"
                    )
                if time.monotonic() > stall:
                    raise _Stalled
            copy_entries(part, new.buckets)
            done += part
        STATS.pipelined += 1
    except BaseException:
        copy_entries(done, old.buckets)  # back to exactly the version `into` held
        STATS.rollbacks += 1
        raise
