"""The processes of `weight_sync.py`: a trainer and a generator actor, and their state.

Pickled by value (the spawned processes cannot import this directory), like the tests' actors.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from collections.abc import Mapping

import cloudpickle  # type: ignore[import-untyped]
import torch
import torch.distributed as dist
from monarch.actor import Actor, endpoint
from monarch.rdma import RDMABuffer
from rdma_tensor import Manifest, Publisher, PullResult, Subscriber, SyncMode

cloudpickle.register_pickle_by_value(sys.modules[__name__])

N_TENSORS = 64  # the state dict: 64 float32 tensors of equal size


def make_state(total_bytes: int, fill: float) -> dict[str, torch.Tensor]:
    n = total_bytes // N_TENSORS // 4
    return {f"layer{i}.weight": torch.full((n,), fill + i) for i in range(N_TENSORS)}


def make_model(total_bytes: int, fill: float) -> torch.nn.Module:
    """A module whose state dict is `make_state(total_bytes, fill)` (same names)."""
    model = torch.nn.Module()
    for name, tensor in make_state(total_bytes, fill).items():
        layer, leaf = name.split(".")
        model.add_module(layer, torch.nn.Module())
        getattr(model, layer).register_parameter(leaf, torch.nn.Parameter(tensor, False))
    return model


def holds(state: Mapping[str, torch.Tensor], fill: float) -> bool:
    return all(bool((t == fill + i).all()) for i, t in enumerate(state.values()))


class Trainer(Actor):
    @endpoint
    async def setup(self, total_bytes: int, threads: int) -> None:
        if threads:
            torch.set_num_threads(threads)
        self.state = make_state(total_bytes, 0.0)
        self.spare = make_state(total_bytes, 0.0)  # target of the reference copy_
        self.publisher = Publisher()
        self.buffers = [RDMABuffer(t.view(torch.uint8)) for t in self.state.values()]

    @endpoint
    async def set_version(self, fill: float) -> None:
        for i, t in enumerate(self.state.values()):
            t.fill_(fill + i)

    @endpoint
    async def publish(self, version: int) -> tuple[Manifest, float]:
        start = time.perf_counter()
        manifest = self.publisher.publish(self.state, version)
        return manifest, time.perf_counter() - start

    @endpoint
    async def copy_seconds(self) -> float:
        """One `copy_` of the state dict in this process (the stall a publish must match)."""
        start = time.perf_counter()
        for dst, src in zip(self.spare.values(), self.state.values(), strict=True):
            dst.copy_(src)
        return time.perf_counter() - start

    @endpoint
    async def rdma_buffers(self) -> list[RDMABuffer]:
        return self.buffers

    @endpoint
    async def state_dict(self) -> dict[str, torch.Tensor]:
        return self.state

    @endpoint
    async def gloo_init(self, port: int) -> None:
        _init_gloo(port, rank=0)

    @endpoint
    async def gloo_broadcast(self) -> None:
        for t in self.state.values():
            dist.broadcast(t, src=0)

    @endpoint
    async def teardown(self) -> None:
        self.publisher.close()
        for buffer in self.buffers:
            await buffer.drop()
        if dist.is_initialized():
            dist.destroy_process_group()
        del self.state, self.spare, self.buffers, self.publisher
        gc.collect()


class Generator(Actor):
    @endpoint
    async def setup(self, total_bytes: int, threads: int) -> None:
        if threads:
            torch.set_num_threads(threads)
        self.state = make_state(total_bytes, -1.0)  # the other methods' destination
        self.source = make_state(total_bytes, 0.0)  # memcpy's source, in this process
        self.model = make_model(total_bytes, -1.0)  # rdma_tensor's: mapped, never written
        self.subscribers: dict[SyncMode, Subscriber] = {
            "auto": Subscriber(self.model),
            "copy": Subscriber(self.state, mode="copy"),
        }

    @endpoint
    async def pull(
        self, manifest: Manifest, mode: SyncMode, min_version: int | None = None
    ) -> PullResult:
        return await self.subscribers[mode].pull(manifest, min_version=min_version)

    @endpoint
    async def rdma_read(self, buffers: list[RDMABuffer]) -> None:
        await asyncio.gather(
            *(
                b.read_into(t.view(torch.uint8))
                for b, t in zip(buffers, self.state.values(), strict=True)
            )
        )

    @endpoint
    async def fetch_by_message(self, trainer: Trainer) -> None:
        received = await trainer.state_dict.call_one()
        for dst, src in zip(self.state.values(), received.values(), strict=True):
            dst.copy_(src)

    @endpoint
    async def gloo_init(self, port: int) -> None:
        _init_gloo(port, rank=1)

    @endpoint
    async def gloo_broadcast(self) -> None:
        for t in self.state.values():
            dist.broadcast(t, src=0)

    @endpoint
    async def memcpy_seconds(self) -> float:
        start = time.perf_counter()
        for dst, src in zip(self.state.values(), self.source.values(), strict=True):
            dst.copy_(src)
        return time.perf_counter() - start

    @endpoint
    async def check_and_reset(self, fill: float, mapped: bool) -> bool:
        """Whether the destination holds `fill`; resets the copied-into one (mapped weights
        are read-only, and each version brings its own values anyway)."""
        if mapped:
            return self.subscribers["auto"].mapped and holds(self.model.state_dict(), fill)
        return self._check_state(fill)

    def _check_state(self, fill: float) -> bool:
        ok = holds(self.state, fill)
        for t in self.state.values():
            t.fill_(-1.0)
        return ok

    @endpoint
    async def check(self, fill: float, where: str) -> bool:
        """Whether a destination holds `fill`: "model" (the mode "auto" subscriber's, mapped
        or not), "mapped" (that model, mapped), or "state" (the copying one's, then reset)."""
        if where == "state":
            return self._check_state(fill)
        mapped = self.subscribers["auto"].mapped
        return holds(self.model.state_dict(), fill) and (mapped or where == "model")

    @endpoint
    async def teardown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        del self.state, self.source, self.model, self.subscribers
        gc.collect()


def _init_gloo(port: int, rank: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
