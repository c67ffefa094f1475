"""Example 08: resharding DTensors from Shard(0) on one mesh to Shard(1) on another.

What it teaches
    The trainer is a mesh of 4 processes holding each weight as a DTensor sharded by rows
    (`Shard(0)`, as FSDP does); the generator is a mesh of 2 other processes that wants it
    sharded by columns (`Shard(1)`, as tensor parallelism does). Each mesh is its own gloo
    process group, so no collective spans both.

    `packages/dtensor-reshard` plans the move from the two layouts alone: for every
    destination rank, which block of which source rank it needs. Each source stages exactly
    the blocks the destinations need (`ShardedPublisher.publish`), the controller merges the
    sources' small manifests (`merge`), and each destination pulls its blocks (`pull`).
    Every byte crosses a process boundary once, to the one destination that needs it.

    The baseline is gather-then-slice: each destination reads every source shard whole
    into a full-size buffer, then keeps its own columns: a full copy per destination.

What to look at
    The plan and its picture, the bytes each method moved, and the checks: both end
    bit-identical to the source, and the overlap method moved each byte once.

Run
    uv run python examples/08_dtensor_reshard.py
    uv run python examples/08_dtensor_reshard.py --transport rdma   # the path between machines
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import torch
import torch.distributed as dist
from _checks import expect
from dtensor_reshard import (
    Layout,
    PlanCache,
    ShardedPublisher,
    ShardManifest,
    merge,
    pull,
    render_overlap,
)
from monarch.actor import Actor, ProcMesh, endpoint, this_host
from monarch.spmd import setup_torch_elastic_env_async
from rdma_tensor import SharedTensor, TensorHandle, Transport, share
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

SHAPES = {"tiny": (10, 6), "big": (2048, 2048)}  # tiny to draw; big (16 MiB) to measure
Layouts = dict[str, Layout]


def weights(name: str) -> torch.Tensor:
    """The global tensor `name`, the same in every process (so anyone can check a copy)."""
    return torch.randn(SHAPES[name], generator=torch.Generator().manual_seed(len(name)))


class Worker(Actor):
    """One process of a mesh: a gloo rank holding one DTensor per name."""

    def __init__(self) -> None:
        # Six processes share the cores: torch's spinning worker threads would take them
        # from the process that is copying (measured: overlap 90-130 ms -> 12 ms on 2 cores).
        torch.set_num_threads(1)
        self.tensors: dict[str, DTensor] = {}
        self.publisher: ShardedPublisher | None = None
        self.shared: list[SharedTensor] = []  # the baseline's handles keep these alive

    @endpoint
    async def build(self, placement: Shard, fill: bool) -> Layouts:
        """The real weights (sources) or -1 everywhere (destinations); returns the layouts."""
        dist.init_process_group("gloo")
        mesh = DeviceMesh("cpu", torch.arange(dist.get_world_size()))
        for name, shape in SHAPES.items():
            full = weights(name) if fill else torch.full(shape, -1.0)
            self.tensors[name] = distribute_tensor(full, mesh, [placement])
        return {name: Layout.from_dtensor(t) for name, t in self.tensors.items()}

    # ---- the package: sources publish, destinations pull
    @endpoint
    async def publish(self, dst: Layouts, version: int, t: Transport | None) -> ShardManifest:
        if self.publisher is None:
            self.publisher = ShardedPublisher(dist.get_rank(), destination=dst, transport=t)
        self.publisher.release(version - 1)  # every destination holds the previous version
        return self.publisher.publish(self.tensors, version)  # a snapshot of my blocks

    @endpoint
    async def pull(self, parts: list[ShardManifest]) -> tuple[int, float]:
        into = {name: t.to_local() for name, t in self.tensors.items()}
        result = await pull(merge(parts), into=into, dst_rank=dist.get_rank())
        return result.bytes_read, result.seconds

    # ---- the baseline: gather every shard whole, then slice
    @endpoint
    async def share(self, t: Transport | None) -> dict[str, TensorHandle]:
        self.shared = [share(self.tensors[n].to_local(), transport=t) for n in SHAPES]
        return {name: s.handle for name, s in zip(SHAPES, self.shared, strict=True)}

    @endpoint
    async def gather(
        self, src: Layouts, handles: list[dict[str, TensorHandle]]
    ) -> tuple[int, float]:
        start, nbytes = time.perf_counter(), 0
        for name, mine in self.tensors.items():
            full = torch.empty(SHAPES[name])
            for rank, by_name in enumerate(handles):  # every source's shard, whole
                box = src[name].local_box(rank)
                nbytes += (await by_name[name].read_into(box.view(full))).nbytes
            mine.to_local().copy_(Layout.from_dtensor(mine).local_box(dist.get_rank()).view(full))
        return nbytes, time.perf_counter() - start

    @endpoint
    async def full_tensors(self) -> dict[str, torch.Tensor]:
        """`full_tensor()` of each DTensor: a collective, so call it on the whole mesh."""
        return {name: t.full_tensor() for name, t in self.tensors.items()}

    @endpoint
    async def reset(self) -> None:
        for t in self.tensors.values():
            t.to_local().fill_(-1.0)


async def demo(src: Worker, dst: Worker, transport: Transport | None) -> None:
    src_layouts = (await src.build.call(Shard(0), True)).item(procs=0)
    dst_layouts = (await dst.build.call(Shard(1), False)).item(procs=0)
    plan = PlanCache().get(src_layouts, dst_layouts)  # a pure function of the two layouts
    print(f"the plan for 'tiny', {plan['tiny'].src.describe()} -> {plan['tiny'].dst.describe()}")
    print(render_overlap(plan["tiny"]))

    async def overlap(version: int) -> list[tuple[int, float]]:
        parts = list((await src.publish.call(dst_layouts, version, transport)).values())
        return list((await dst.pull.call(parts)).values())

    handles = list((await src.share.call(transport)).values())

    async def gather(_: int) -> list[tuple[int, float]]:
        return list((await dst.gather.call(src_layouts, handles)).values())

    total = sum(weights(n).numel() * 4 for n in SHAPES)
    results, copies = {}, {}
    for method, once in (("overlap", overlap), ("gather", gather)):
        await dst.reset.call()
        rounds = [await once(v) for v in range(1, 5)]  # the first round warms up
        nbytes = sum(b for b, _ in rounds[-1])
        seconds = statistics.median(max(s for _, s in r) for r in rounds[1:])
        results[method] = nbytes, seconds
        copies[method] = (await dst.full_tensors.call()).item(procs=0)
        print(f"{method:>8}: {nbytes / 2**20:5.1f} MiB read, {1e3 * seconds:6.1f} ms ", end="")
        print("(the slowest destination, median of 3 rounds)")

    for method, got in copies.items():
        same = all(torch.equal(got[n], weights(n)) for n in SHAPES)
        expect(same, f"{method}: the generator mesh's full_tensor() is bit-identical")
    expect(results["overlap"][0] == total, "overlap read each byte once (16 MiB in all)")
    expect(results["gather"][0] == 2 * total, "gather read a full copy per destination")


async def main() -> None:
    parser = argparse.ArgumentParser(description="resharding DTensors between two meshes")
    parser.add_argument("--transport", choices=["shm", "rdma"], default="shm")
    transport = Transport(parser.parse_args().transport)
    meshes: list[ProcMesh] = []
    try:
        for name, n in (("trainer", 4), ("generator", 2)):  # two separate gloo worlds
            meshes.append(this_host().spawn_procs(per_host={"procs": n}, name=name))
            await setup_torch_elastic_env_async(meshes[-1])  # env for init_process_group
        src, dst = (m.spawn(f"worker{i}", Worker) for i, m in enumerate(meshes))
        await demo(src, dst, transport)
    finally:
        for mesh in meshes:
            await mesh.stop()


if __name__ == "__main__":
    asyncio.run(main())
