"""Pulling over RDMA (another machine, or forced): no leases, so verify and retry.

Headers and buckets are read into local memory (the buckets into a receive buffer the
subscriber keeps, see `_receive`); the slot's header is read again after the buckets, and if
its sequence number moved the publisher started rewriting the slot during the read: the
bytes are thrown away and the pull retries with whatever is newest then. Only a verified
version reaches `into`: copied from the receive buffer, or, with `adopt`, as views of it for
the caller to swap in (nothing copied).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import torch

from rdma_tensor import _receive
from rdma_tensor._owner import is_local
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
from rdma_tensor._receive import ReceivePool
from rdma_tensor.errors import (
    PublisherClosedError,
    PublisherDiedError,
    PullTimeoutError,
    TransportError,
)
from rdma_tensor.handle import TensorHandle, check_owner
from rdma_tensor.manifest import Manifest
from rdma_tensor.staging import HEADER_BYTES, SlotHeader, SlotState
from rdma_tensor.transport import Transport

_WATCH_S = 0.05  # how often a waiting RDMA read checks that a same-machine owner is alive


async def pull_rdma(
    manifest: Manifest, plan: Plan, goal: Goal, pool: ReceivePool, *, adopt: bool
) -> Outcome:
    """Waits for a complete version >= `goal.want` and reads it into a buffer of `pool`;
    then copies it into `plan`'s tensors or, with `adopt`, returns views of the buffer
    (`Outcome.views`, nothing copied) that keep it out of the pool for as long as they live."""
    layout = manifest.bucket_layout
    buffer = pool.take(layout)
    try:
        outcome = await _read_version(manifest, plan, goal, _receive.buckets(buffer, layout))
    except BaseException:
        pool.give_back(buffer, layout.bucket_nbytes)
        raise
    if not outcome.changed:  # `into` holds that version already: nothing was read
        pool.give_back(buffer, layout.bucket_nbytes)
        return outcome
    if adopt:
        received = _receive.adopt(pool, buffer, layout)
        views = {
            e.name: received[e.bucket][e.offset : e.offset + e.nbytes].view(e.dtype).view(e.shape)
            for e, _ in plan
        }
        return dataclasses.replace(outcome, views=views)
    start = time.perf_counter()
    try:
        copy_entries(plan, _receive.buckets(buffer, layout))
    finally:
        pool.give_back(buffer, layout.bucket_nbytes)
    copied = time.perf_counter() - start
    return dataclasses.replace(outcome, copy_seconds=outcome.copy_seconds + copied)


async def _read_version(
    manifest: Manifest, plan: Plan, goal: Goal, scratch: list[torch.Tensor]
) -> Outcome:
    """Reads the newest complete version >= `goal.want` into `scratch` and verifies it
    (`changed` False: `into` holds that version already, nothing was read)."""
    owner = manifest.slots[0].header.owner
    local = is_local(owner.process)

    async def read(handle: TensorHandle, dst: torch.Tensor) -> None:
        remaining = goal.deadline - time.monotonic()
        if remaining <= 0:
            raise PullTimeoutError(f"version >= {goal.want} did not arrive within {goal.wait_s}s")
        transfer = handle.read_into(dst, timeout=remaining, transport=Transport.RDMA)
        try:
            if not local:  # only the transfer's own timeout can tell a dead owner here
                await transfer
            else:
                # A transfer from a dead owner only ends at its timeout; on the owner's
                # machine we can see the death sooner and stop waiting.
                task = asyncio.ensure_future(transfer)
                try:
                    while not (await asyncio.wait({task}, timeout=_WATCH_S))[0]:
                        check_owner(owner)
                    task.result()
                finally:
                    task.cancel()  # no-op once done
        except (PublisherClosedError, PublisherDiedError, PullTimeoutError):
            raise
        except Exception as e:
            if local:
                check_owner(owner)
            raise TransportError(
                f"RDMA read from the publisher on {owner.process.machine} failed "
                f"(closed, dead or unreachable): {e}"
            ) from e

    headers_raw = [torch.empty(HEADER_BYTES, dtype=torch.uint8) for _ in manifest.slots]
    retries, backoff = 0, 0.001
    while True:
        if local:
            check_owner(owner)
        await asyncio.gather(
            *(read(s.header, h) for s, h in zip(manifest.slots, headers_raw, strict=True))
        )
        headers = [SlotHeader.parse(h) for h in headers_raw]
        check_not_closed(headers)
        best = newest(headers, goal.want, SlotState.COMPLETE)
        if best is not None:
            if headers[best].version == goal.applied:
                return Outcome(headers[best].version, False, 0, 0.0, retries)
            ref = manifest.slots[best]
            t0 = time.perf_counter()
            await asyncio.gather(*(read(b, s) for b, s in zip(ref.buckets, scratch, strict=True)))
            await read(ref.header, headers_raw[best])
            if SlotHeader.parse(headers_raw[best]) == headers[best]:
                elapsed = time.perf_counter() - t0
                return Outcome(headers[best].version, True, plan_bytes(plan), elapsed, retries)
            retries += 1  # the publisher began rewriting that slot mid-read: discard, retry
            continue
        if time.monotonic() > goal.deadline:
            raise timeout_error(goal, headers)
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, 0.02)
