"""The generator's side of weight sync: a `Subscriber` owns a destination and its version.

    subscriber = Subscriber(model)                  # an nn.Module, or a state dict
    result = await subscriber.pull(manifest)        # all or nothing; result.mapped tells how

Each pull checks the destination against the manifest before touching anything, waits for a
complete version at least as new as the manifest's (or `min_version`), and applies the newest
one, in one of two ways (`mode`):

- "map" (same machine, CPU, no cast, an `nn.Module`): nothing is copied. The module's
  parameters and buffers are re-pointed (`tensor.data = view`) to read-only views of the
  publisher's staging slot, all in one synchronous step between two awaits, so no coroutine
  of this process sees a mix of versions. The views pin the slot (a shared `flock` lease tied
  to their memory, see `_lease`): the publisher never rewrites it while any of them lives.
  The next pull re-points the module to the next version and the old views, and so the old
  lease, go away (unless the caller still holds some: then the lease stays too).
- "copy": the bytes are copied into the destination tensors in place (any device, any
  strides, optional floating-point cast), straight from the mapped slot on the same machine,
  through RDMA and a receive buffer otherwise (`_pull_shm`, `_pull_rdma`).

"auto" (the default) maps whenever it can, deciding on every pull. On another machine (RDMA)
it *adopts* where map mode would map: the version arrives in a receive buffer of this
subscriber's own (writable memory, see `_receive`), and once verified the module is
re-pointed to views of that buffer in the same synchronous step, so nothing is copied after
the transfer. Otherwise it copies.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol, get_args

import torch

from rdma_tensor._owner import Owner
from rdma_tensor._pull_rdma import pull_rdma
from rdma_tensor._pull_shm import pull_shm
from rdma_tensor._pulling import Goal, Outcome, Plan, check_destination
from rdma_tensor._receive import ReceivePool
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


class _LatestManifest(Protocol):
    def call_one(self) -> Awaitable[Manifest]: ...


class ManifestSource(Protocol):
    """An actor whose `latest_manifest` endpoint answers its newest `Manifest`
    (`actors.WeightPublisher`)."""

    @property
    def latest_manifest(self) -> _LatestManifest: ...


SyncMode = Literal["auto", "copy", "map"]
"""How a `Subscriber` applies a version: map the staging memory, copy it, or choose."""


@dataclass(frozen=True)
class PullResult:
    """One pull: `version` is what the destination now holds.

    changed: False when it already held that version (nothing was copied or mapped).
    mapped: True when the destination now runs on leased views of the staging memory
        (map mode; nothing was copied), False when the bytes were copied into it.
    adopted: True when the version came over RDMA and the destination now runs on views of
        the buffer it arrived in (mode "auto", see the module docstring; nothing was copied
        after the transfer).
    nbytes: bytes of tensor data the new version brought (copied, or mapped if `mapped`).
    wait_seconds: time spent waiting for the version to be staged (and for a lease).
    copy_seconds: time spent moving bytes (RDMA reads included), or leasing and building
        the views when `mapped`.
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
    mapped: bool = False
    adopted: bool = False


class Subscriber:
    """Applies published versions to one destination and remembers the version it holds.

    into: an `nn.Module` (its `state_dict(keep_vars=True)` tensors are updated: the
        parameters and persistent buffers) or a mapping of name to tensor (updated in place).
        Names and shapes must match the published state dict.
    mode: "auto" (default), "copy" or "map" (see the module docstring). "map" needs an
        `nn.Module`: a `model.state_dict()` holds detached tensors, and re-pointing those
        would leave the module itself on the old weights. A mapped module's weights are
        read-only: writing to them in place kills the process (SIGSEGV); call `unmap()`
        first, or use "copy", if the generator modifies its weights. Over RDMA, "auto"
        adopts instead of mapping (the module runs on this subscriber's writable receive
        buffer; `PullResult.adopted`).
    transport: force a transport (default: the publisher's choice, else auto).

    The version is remembered per publisher: a pull asking for an older version than the
    one held raises `StaleVersionError`; a manifest from another publisher (a restarted
    trainer) starts a new sequence of versions. Pull from one task at a time.
    """

    def __init__(
        self,
        into: torch.nn.Module | Mapping[str, torch.Tensor],
        *,
        mode: SyncMode = "auto",
        transport: Transport | None = None,
    ) -> None:
        if mode not in get_args(SyncMode):
            raise ValueError(f"mode must be one of {get_args(SyncMode)}, got {mode!r}")
        if not isinstance(into, torch.nn.Module | Mapping):
            raise TypeError(
                f"into must be an nn.Module or a mapping of name to tensor, got "
                f"{type(into).__name__}"
            )
        if mode == "map" and not isinstance(into, torch.nn.Module):
            raise ValueError(
                "mode='map' re-points the module's own tensors: pass the nn.Module itself "
                "(a state_dict() holds detached tensors the module would never see)"
            )
        self.into = into
        self.mode: SyncMode = mode
        self.transport = transport
        self._version: int | None = None
        self._publisher_id: str | None = None
        self._mapped_from: Owner | None = None
        self._receive = ReceivePool()  # RDMA pulls land here (kept: fresh memory is slow)

    @property
    def version(self) -> int | None:
        """The version the destination holds, None before the first pull."""
        return self._version

    @property
    def mapped(self) -> bool:
        """Whether the destination currently runs on leased views of staging memory."""
        return self._mapped_from is not None

    def unmap(self) -> None:
        """Copies mapped weights into this process's own memory and lets go of the slot.

        The weights and `version` stay the same; the publisher may reuse the slot, and the
        memory of a closed or dead publisher can be freed. A later pull in "auto" or "map"
        mode maps again. No-op when nothing is mapped.
        """
        if self._mapped_from is None:
            return
        seen: set[int] = set()
        with torch.no_grad():
            for t in self._targets().values():
                if id(t) not in seen:  # tied weights: one tensor under two names
                    seen.add(id(t))
                    t.data = t.data.clone()
        self._mapped_from = None

    async def pull(
        self,
        source: Manifest | ManifestSource,
        *,
        allow_cast: bool = False,
        min_version: int | None = None,
        timeout: float = 60.0,  # noqa: ASYNC109 - bounds waiting for the version, not one await
    ) -> PullResult:
        """Applies the newest completely staged version >= the manifest's, all or nothing.

        source: a `Manifest` from `Publisher.publish`, or a `WeightPublisher` actor (its latest
            manifest is fetched).
        allow_cast: copy floating point into other floating-point dtypes (e.g. float32 ->
            bfloat16); otherwise dtypes must match.
        min_version: wait for at least this version (default: the manifest's).
        timeout: seconds to wait for the version before raising `PullTimeoutError`.

        Raises `MismatchError` for names/shapes/dtypes that do not fit (and, in "map" mode,
        for CUDA or cast destinations), `TransportError` when "map" mode meets a publisher on
        another machine, `StaleVersionError` when the version asked for is older than the one
        held, `PublisherClosedError` / `PublisherDiedError` when the publisher closed or died,
        `PullTimeoutError`. On any error the destination is unchanged (and a mapped one keeps
        its views, still valid: Linux keeps a dead publisher's memory while it is mapped).
        """
        start = time.perf_counter()
        if isinstance(source, Manifest):
            manifest = source
        else:
            manifest = await source.latest_manifest.call_one()
        targets = self._targets()
        plan = check_destination(manifest, targets, allow_cast)
        applied = self._version if manifest.publisher_id == self._publisher_id else None
        want = max(manifest.version, min_version if min_version is not None else 0)
        if applied is not None and want < applied:
            raise StaleVersionError(
                f"asked for version {want}, older than version {applied} already applied"
            )
        chosen = choose_transport(manifest.slots[0].header, self.transport)
        map_views = self._can_map(plan, chosen)
        adopt = chosen is Transport.RDMA and self.mode == "auto" and not self._view_problems(plan)
        goal = Goal(want, applied, time.monotonic() + timeout, timeout)
        owner = manifest.slots[0].header.owner
        try:
            if chosen is Transport.SHM:
                if not map_views:
                    self.unmap()  # never copy into read-only views
                outcome = await pull_shm(manifest, plan, goal, map_views=map_views)
            elif chosen is Transport.RDMA:
                if not adopt:
                    self.unmap()  # never copy into read-only views
                outcome = await pull_rdma(manifest, plan, goal, self._receive, adopt=adopt)
            else:
                raise TransportError("staging memory is CPU memory: cuda_ipc cannot carry it")
        except (PublisherClosedError, PublisherDiedError):
            # Drop this process's cached mappings so the kernel can free the memory; views
            # the destination still runs on keep their own reference to it (see `_lease`).
            forget_owner(owner)
            raise
        if outcome.views is not None:
            _swap(plan, outcome.views)
            self._mapped_from = owner if chosen is Transport.SHM else None  # else: adopted
        self._version, self._publisher_id = outcome.version, manifest.publisher_id
        adopted = outcome.views is not None and chosen is Transport.RDMA
        return _result(outcome, chosen, time.perf_counter() - start, self.mapped, adopted)

    def _targets(self) -> Mapping[str, torch.Tensor]:
        if isinstance(self.into, torch.nn.Module):
            return self.into.state_dict(keep_vars=True)
        return self.into

    def _view_problems(self, plan: Plan) -> list[str]:
        """Why the destination cannot be re-pointed to views of CPU memory holding the
        published bytes (map or adopt); empty when it can."""
        if self.mode == "copy" or not isinstance(self.into, torch.nn.Module):
            return [f"mode={self.mode!r} into a {type(self.into).__name__}"]
        problems = []
        for e, dst in plan:
            if dst.device.type != "cpu":
                problems.append(f"{e.name} is on {dst.device}")
            elif dst.dtype != e.dtype:
                problems.append(f"{e.name} is {dst.dtype}, published {e.dtype} (a cast copies)")
            elif type(dst) not in (torch.Tensor, torch.nn.Parameter) or not dst.is_leaf:
                problems.append(f"{e.name} is a {type(dst).__name__} that cannot be re-pointed")
        return problems

    def _can_map(self, plan: Plan, transport: Transport) -> bool:
        """Whether this pull maps; raises in "map" mode when it cannot, naming why."""
        if self.mode == "copy" or not isinstance(self.into, torch.nn.Module):
            return False
        problems = self._view_problems(plan)
        if self.mode == "auto":
            return not problems and transport is Transport.SHM
        if transport is not Transport.SHM:
            raise TransportError(
                f"mode='map' needs the publisher's machine and shared memory; this pull "
                f"would use {transport.value}; use mode='copy' or 'auto'"
            )
        if problems:
            raise MismatchError(
                "mode='map' maps CPU staging memory as is; use mode='copy' or 'auto' for: "
                + "; ".join(problems[:5])
            )
        return True


def _swap(plan: Plan, views: Mapping[str, torch.Tensor]) -> None:
    """Re-points every destination tensor to its view in one step; undone if one fails."""
    done: list[tuple[torch.Tensor, torch.Tensor]] = []
    try:
        for e, dst in plan:
            done.append((dst, dst.data))
            dst.data = views[e.name]
    except BaseException:
        for dst, old in reversed(done):
            dst.data = old
        raise


def _result(
    outcome: Outcome, transport: Transport, seconds: float, mapped: bool, adopted: bool
) -> PullResult:
    return PullResult(
        version=outcome.version,
        changed=outcome.changed,
        transport=transport,
        nbytes=outcome.nbytes,
        wait_seconds=max(0.0, seconds - outcome.copy_seconds),
        copy_seconds=outcome.copy_seconds,
        seconds=seconds,
        retries=outcome.retries,
        pipelined=outcome.pipelined,
        mapped=mapped,
        adopted=adopted,
    )
