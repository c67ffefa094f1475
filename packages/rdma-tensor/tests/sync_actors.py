"""Actors and data the tests use. Pickled by value: spawned processes cannot import this
directory, so cloudpickle ships the classes themselves.

Every version of the test state dict is `base + version`, where `base` is fixed random data:
a reader can recompute exactly what any version must hold, so a tensor from another version
(a torn read) or a half-copied tensor fails `matches`.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

import cloudpickle  # type: ignore[import-untyped]
import torch
from monarch.actor import Actor, endpoint
from rdma_tensor import (
    Manifest,
    PublisherConfig,
    PullResult,
    SyncMode,
    TensorHandle,
    Transport,
    WeightPublisher,
    WeightSubscriber,
    _lease,
    _pull_shm,
    pull,
    share,
)
from rdma_tensor import _shm as shm
from rdma_tensor._owner import FdRef
from rdma_tensor.machine import this_machine

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SHAPES = {"embed": (64, 96), "layer.0.w": (96, 96), "layer.0.b": (96,), "head": (96, 64)}


def base_state(shapes: Mapping[str, tuple[int, ...]] = SHAPES) -> dict[str, torch.Tensor]:
    """Fixed random data per name (seeded by the name, so the order of `shapes` is free)."""
    return {
        name: torch.rand(shape, generator=torch.Generator().manual_seed(zlib.crc32(name.encode())))
        for name, shape in shapes.items()
    }


def version_state(
    version: int, shapes: Mapping[str, tuple[int, ...]] = SHAPES
) -> dict[str, torch.Tensor]:
    return {name: t + version for name, t in base_state(shapes).items()}


def make_module(
    shapes: Mapping[str, tuple[int, ...]] = SHAPES,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> torch.nn.Module:
    """A module whose state dict has exactly `shapes`' dotted names, all zeros (the last
    name part is a parameter; the parts before it are nested submodules)."""
    root = torch.nn.Module()
    for name, shape in shapes.items():
        *path, leaf = name.split(".")
        module = root
        for part in path:
            if not hasattr(module, part):
                module.add_module(part, torch.nn.Module())
            module = getattr(module, part)
        zeros = torch.zeros(shape, dtype=dtype, device=device)
        module.register_parameter(leaf, torch.nn.Parameter(zeros, requires_grad=False))
    return root


def matches(state: Mapping[str, torch.Tensor], version: int) -> bool:
    """Whether every tensor of `state` is exactly version `version` (bit for bit)."""
    shapes = {name: tuple(t.shape) for name, t in state.items()}
    expected = version_state(version, shapes)
    return all(
        torch.equal(t.detach().cpu().to(expected[name].dtype), expected[name])
        for name, t in state.items()
    )


def staging_files(manifest: Manifest) -> set[FdRef]:
    """The shared-memory files of a publisher's staging slots."""
    return {ref.header.shm.file for ref in manifest.slots if ref.header.shm is not None}


@dataclass(frozen=True)
class Outcome:
    """A pull as the controller sees it: the result, or the error's type and message."""

    result: PullResult | None
    error: str
    message: str
    seconds: float


class Owner(Actor):
    """Shares one tensor and can change or close it."""

    @endpoint
    async def share(
        self, data: torch.Tensor, transport: Transport | None, device: str = "cpu"
    ) -> TensorHandle:
        # The copy to `device` happens here: a CUDA tensor sent as an endpoint's argument
        # arrives in CPU memory (seen on the first GPU run), so the owner must make its own.
        self.tensor = data.to(device, copy=True)
        self.shared = share(self.tensor, transport=transport)
        return self.shared.handle

    @endpoint
    async def add(self, value: float) -> None:
        self.tensor.add_(value)

    @endpoint
    async def close(self) -> None:
        self.shared.close()


@dataclass(frozen=True)
class WhoAmI:
    """Where a process runs: `host`, the pid of the Monarch host process that spawned it, and
    the machine id it declared (`RDMA_TENSOR_MACHINE_ID`, "" if none)."""

    host: int
    machine_id: str


class Reader(Actor):
    """Reads handles into fresh tensors and sends them back."""

    @endpoint
    async def whoami(self) -> WhoAmI:
        return WhoAmI(os.getppid(), this_machine().machine_id)

    @endpoint
    async def read(
        self, handle: TensorHandle, dst: torch.Tensor, offset: int, transport: Transport | None
    ) -> tuple[torch.Tensor, Transport]:
        result = await handle.read_into(dst, offset=offset, transport=transport)
        return dst, result.transport

    @endpoint
    async def read_transposed(self, handle: TensorHandle, rows: int, cols: int) -> torch.Tensor:
        """Reads into a non-contiguous (transposed) destination."""
        dst = torch.zeros(cols, rows, dtype=handle.dtype).t()
        await handle.read_into(dst)
        return dst.contiguous()

    @endpoint
    async def read_error(self, handle: TensorHandle, dst: torch.Tensor) -> str:
        return await _read_error(handle, dst, None)

    @endpoint
    async def read_error_forced(
        self, handle: TensorHandle, dst: torch.Tensor, transport: Transport
    ) -> str:
        return await _read_error(handle, dst, transport)


async def _read_error(handle: TensorHandle, dst: torch.Tensor, transport: Transport | None) -> str:
    """The error a read raises, as "ErrorType: message" ("no error" if it succeeded)."""
    try:
        await handle.read_into(dst, timeout=5, transport=transport)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


class Trainer(WeightPublisher):
    """Publishes `version_state(v)` for the versions it is asked for."""

    def __init__(self, config: PublisherConfig | None = None, device: str = "cpu") -> None:
        super().__init__(config)
        self.state = {n: t.to(device) for n, t in base_state().items()}
        self.base = {n: t.to(device) for n, t in base_state().items()}

    def _set(self, version: int) -> None:
        for name, t in self.state.items():
            torch.add(self.base[name], version, out=t)

    @endpoint
    async def publish(self, version: int) -> Manifest:
        self._set(version)
        return self.publish_weights(self.state, version)

    @endpoint
    async def try_publish(self, version: int) -> str:
        """Publishes `version`; returns "" or the error's type and message."""
        self._set(version)
        try:
            self.publish_weights(self.state, version)
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return ""

    @endpoint
    async def latest_version(self) -> int | None:
        latest = self.publisher.latest
        return None if latest is None else latest.version

    @endpoint
    async def publish_many(self, first: int, last: int, interval_s: float) -> float:
        """Publishes versions first..last, pausing between them; returns the longest stall."""
        longest = 0.0
        for v in range(first, last + 1):
            self._set(v)
            start = time.perf_counter()
            self.publish_weights(self.state, v)
            longest = max(longest, time.perf_counter() - start)
            await asyncio.sleep(interval_s)
        return longest

    @endpoint
    async def stage_first_bucket(self, version: int) -> Manifest:
        """Starts publishing `version` but stops after its first bucket, as if it hung or died
        right there; returns the manifest a reader would be waiting on."""
        self._set(version)
        slot, manifest, tensors = self.publisher._begin(self.state, version)
        self.publisher._write(slot, tensors, buckets=[0])
        return manifest

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


class Generator(WeightSubscriber):
    """Holds a zeroed copy of the state dict (in `dtype`) and pulls versions into it.

    module: hold the weights in an `nn.Module` (which `mode` "auto"/"map" can map) instead of
    a plain state dict (always copied).
    """

    def __init__(
        self,
        dtype: torch.dtype = torch.float32,
        transposed: bool = False,
        device: str = "cpu",
        module: bool = False,
        mode: SyncMode = "auto",
    ) -> None:
        super().__init__(mode)
        self.model = make_module(SHAPES, dtype, device) if module else None
        self.plain = {n: torch.zeros(s, dtype=dtype, device=device) for n, s in SHAPES.items()}
        if transposed:  # non-contiguous destinations
            self.plain = {
                n: torch.zeros(s[::-1], dtype=dtype, device=device).t() for n, s in SHAPES.items()
            }

    def weights(self) -> torch.nn.Module | Mapping[str, torch.Tensor]:
        return self.plain if self.model is None else self.model

    @property
    def state(self) -> Mapping[str, torch.Tensor]:
        return self.plain if self.model is None else self.model.state_dict()

    @endpoint
    async def try_pull(
        self,
        manifest: Manifest,
        *,
        transport: Transport | None = None,
        allow_cast: bool = False,
        into: dict[str, torch.Tensor] | None = None,
        timeout_s: float = 30.0,
        min_version: int | None = None,
    ) -> Outcome:
        """Pulls through this generator's Subscriber, or, given `into`, with `pull`."""
        start = time.perf_counter()
        try:
            if into is not None:
                result = await pull(
                    manifest,
                    into=into,
                    transport=transport,
                    allow_cast=allow_cast,
                    timeout=timeout_s,
                    min_version=min_version,
                )
            else:
                self.subscriber.transport = transport
                result = await self.subscriber.pull(
                    manifest, allow_cast=allow_cast, timeout=timeout_s, min_version=min_version
                )
        except Exception as e:
            return Outcome(None, type(e).__name__, str(e), time.perf_counter() - start)
        return Outcome(result, "", "", time.perf_counter() - start)

    @endpoint
    async def follow(self, manifest: Manifest, last: int, transport: Transport | None) -> list[int]:
        """Pulls newer and newer versions until `last`, checking each one bit for bit, also
        a moment later (a mapped version must not change while the publisher goes on).
        Returns the versions seen; raises on the first torn or wrong state."""
        seen: list[int] = []
        version = manifest.version - 1
        self.subscriber.transport = transport
        while version < last:
            result = await self.subscriber.pull(manifest, min_version=version + 1)
            version = result.version
            for when in ("after pulling", "a moment after pulling"):
                if not matches(self.state, version):
                    raise AssertionError(f"state {when} version {version} is not that version")
                await asyncio.sleep(0.002)
            seen.append(version)
        return seen

    @endpoint
    async def holds(self, version: int) -> bool:
        return matches(self.state, version)

    @endpoint
    async def keep(self, name: str) -> None:
        """Keeps a reference to one weight as it is now (a caller holding an old weight)."""
        self.kept = {name: self.state[name]}

    @endpoint
    async def kept_holds(self, version: int) -> bool:
        """Whether the kept weight still holds `version`; then drops it."""
        ok = matches(self.kept, version)
        del self.kept
        return ok

    @endpoint
    async def add_in_place(self, value: float) -> None:
        """An in-place write into every weight (what a generator that fine-tunes would do)."""
        with torch.no_grad():
            for t in self.state.values():
                t.add_(value)

    @endpoint
    async def data_ptrs(self) -> dict[str, int]:
        return {n: t.data_ptr() for n, t in self.state.items()}

    @endpoint
    async def free_receive_buffers(self) -> int:
        """Receive buffers this generator's subscriber holds for its next RDMA pulls."""
        return self.subscriber._receive.free

    @endpoint
    async def is_mapped(self) -> bool:
        return self.subscriber.mapped

    @endpoint
    async def unmap(self) -> None:
        self.subscriber.unmap()

    @endpoint
    async def state_dict(self) -> dict[str, torch.Tensor]:
        return {n: t.cpu().clone() for n, t in self.state.items()}

    @endpoint
    async def mapped_bytes(self, manifest: Manifest) -> int:
        """Staging memory of `manifest`'s publisher that this process maps: cached or leased."""
        files = staging_files(manifest)
        return shm.mapped_bytes(files) + _lease.leased_bytes(files)

    @endpoint
    async def cuda_registered_bytes(self) -> int:
        """Staging memory this process has mapped page-locked for CUDA."""
        return shm.cuda_registered_bytes()

    @endpoint
    async def leased_bytes(self, manifest: Manifest) -> int:
        """Staging memory of `manifest`'s publisher that leased views in this process pin."""
        return _lease.leased_bytes(staging_files(manifest))

    @endpoint
    async def pipeline_stats(self) -> tuple[int, int]:
        """(pipelined pulls, pipelined pulls undone) in this process."""
        # Through the module: this file is pickled by value, and a bare `STATS` would travel
        # as a copy of the controller's counters.
        return _pull_shm.STATS.pipelined, _pull_shm.STATS.rollbacks
