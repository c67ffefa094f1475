"""Example 08: resharding DTensors from Shard(0) on one mesh to Shard(1) on another.

What it teaches
    The trainer and the generators rarely cut the weights the same way. Here the trainer is
    a mesh of 4 processes holding each weight as a DTensor sharded by rows (`Shard(0)`, as
    FSDP does); the generator is a mesh of 2 other processes that wants it sharded by columns
    (`Shard(1)`, as tensor parallelism does). Each mesh is its own gloo process group, so no
    collective can span both.

    `packages/dtensor-reshard` plans the move from the two layouts alone, with a pure
    function: for every destination rank, which block of which source rank it needs. Both
    sides compute the same plan, so nothing but a few small handles travels in messages.
    Then each source shares its shard (`PlanPublisher`) and each destination copies exactly
    its blocks out of the sources' memory (`pull_plan`). Every byte crosses a process boundary
    once, and only to the destination that needs it.

    The baseline is gather-then-slice: each destination reads every source shard in full
    into a full-size buffer, then keeps its own columns. It is simpler and moves a full copy
    of the tensor to every destination.

What to look at
    The plan (who reads what from whom), the ASCII picture of the overlap, the bytes each
    method moved and how long it took, and the checks: both methods end bit-identical to
    the source, and the overlap method moved exactly the planned minimum.

    On one machine the sources share their shards in place and destinations copy straight
    out of them (shared memory). `--transport rdma` runs the path used between machines:
    sources pack each destination's blocks into one staging buffer that the destination
    reads whole with Monarch's `RDMABuffer` (TCP on a machine without RDMA NICs).

Run
    uv run python examples/08_dtensor_reshard.py
    uv run python examples/08_dtensor_reshard.py --transport rdma
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from dtensor_reshard import (
    Layout,
    PlanCache,
    PlanPublisher,
    ReshardPlan,
    SourceExport,
    pull_plan,
    render_overlap,
)
from monarch.actor import Actor, ProcMesh, endpoint, this_host
from monarch.spmd import setup_torch_elastic_env_async
from rdma_tensor import SharedTensor, TensorHandle, Transport, share
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

SOURCES, DESTINATIONS = 4, 2
# "tiny" is small enough to draw; "big" (16 MiB) makes the byte counts and times mean something.
SHAPES = {"tiny": (10, 6), "big": (2048, 2048)}
ROUNDS = 3


def weights(name: str) -> torch.Tensor:
    """The global tensor `name`, identical in every process (so anyone can check a copy)."""
    g = torch.Generator().manual_seed(len(name) * 1000 + SHAPES[name][0])
    return torch.randn(SHAPES[name], generator=g)


@dataclass(frozen=True)
class Moved:
    """One destination rank in one transfer: bytes it read out of other processes, and the
    seconds it spent (inside `pull_plan`, checks included, or inside the gather)."""

    nbytes: int
    seconds: float


class Worker(Actor):
    """One process of a mesh: a gloo rank holding one DTensor per name."""

    def __init__(self) -> None:
        self.tensors: dict[str, DTensor] = {}
        self.cache = PlanCache()  # plans are computed once per pair of layouts
        self.publisher: PlanPublisher | None = None
        self.shared: list[SharedTensor] = []
        self.full: dict[str, torch.Tensor] = {}  # the gather baseline's full-size buffers

    @endpoint
    async def build(self, placement: Shard, fill: bool) -> dict[str, Layout]:
        """Creates the DTensors: the real weights (sources) or -1 everywhere (destinations)."""
        if not dist.is_initialized():
            dist.init_process_group("gloo")
        mesh = DeviceMesh("cpu", torch.arange(dist.get_world_size()))
        for name, shape in SHAPES.items():
            full = weights(name) if fill else torch.full(shape, -1.0)
            self.tensors[name] = distribute_tensor(full, mesh, [placement])
            if not fill:  # allocated and touched once, so no round pays for page faults
                self.full[name] = torch.zeros(shape)
        return {name: Layout.from_dtensor(t) for name, t in self.tensors.items()}

    @endpoint
    async def local_shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(t.to_local().shape) for name, t in self.tensors.items()}

    # ---- overlap: the package's two sides
    @endpoint
    async def publish(
        self, src: dict[str, Layout], dst: dict[str, Layout], transport: Transport | None
    ) -> SourceExport:
        plan = self.cache.get(src, dst)
        if self.publisher is None:
            self.publisher = PlanPublisher(dist.get_rank(), transport=transport)
        return self.publisher.publish(plan, self.tensors)

    @endpoint
    async def pull(
        self, src: dict[str, Layout], dst: dict[str, Layout], exports: list[SourceExport]
    ) -> Moved:
        plan = self.cache.get(src, dst)
        stats = await pull_plan(plan, dist.get_rank(), exports, self.tensors)
        return Moved(stats.bytes_read, stats.seconds)

    @endpoint
    async def release(self) -> None:
        if self.publisher is not None:
            self.publisher.release()

    # ---- gather-then-slice: the baseline
    @endpoint
    async def share_shards(self, transport: Transport | None) -> dict[str, TensorHandle]:
        if not self.shared:
            self.shared = [share(self.tensors[n].to_local(), transport=transport) for n in SHAPES]
        return {name: s.handle for name, s in zip(SHAPES, self.shared, strict=True)}

    @endpoint
    async def gather(self, src: dict[str, Layout], handles: list[dict[str, TensorHandle]]) -> Moved:
        """Reads every source shard whole into a full-size tensor, then keeps its own part."""
        start, nbytes = time.perf_counter(), 0
        for name, dtensor in self.tensors.items():
            full = self.full[name]
            reads = [
                by_name[name].read_into(src[name].local_box(rank).view(full))
                for rank, by_name in enumerate(handles)
            ]
            nbytes += sum(r.nbytes for r in await asyncio.gather(*reads))
            mine = Layout.from_dtensor(dtensor).local_box(dist.get_rank())
            dtensor.to_local().copy_(mine.view(full))
        return Moved(nbytes, time.perf_counter() - start)

    # ---- checks
    @endpoint
    async def full_tensors(self) -> dict[str, torch.Tensor]:
        """`full_tensor()` of every DTensor: a collective, so call it on the whole mesh."""
        return {name: t.full_tensor() for name, t in self.tensors.items()}

    @endpoint
    async def reset(self) -> None:
        for t in self.tensors.values():
            t.to_local().fill_(-1.0)

    @endpoint
    async def close(self) -> None:
        if self.publisher is not None:
            self.publisher.close()
        for s in self.shared:
            s.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def expect(ok: bool, what: str) -> None:
    """Print a check's outcome; a failed check ends the example with a non-zero status."""
    if not ok:
        raise RuntimeError(f"check failed: {what}")
    print(f"  ok: {what}")


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def show_plan(plan: ReshardPlan, name: str) -> None:
    p = plan[name]
    print(f"\nthe plan for {name!r}, {p.src.describe()} -> {p.dst.describe()}:")
    for d, pieces in enumerate(p.pieces):
        print(f"  destination {d} (global block {p.dst.local_box(d)}) reads")
        for piece in pieces:
            nbytes = piece.numel * p.dst.itemsize
            print(f"    {piece.global_box} from source {piece.src_rank} ({nbytes} bytes)")
    print()
    print(render_overlap(p))


async def rounds(once: Callable[[], Awaitable[list[Moved]]]) -> tuple[int, float]:
    """Runs a transfer ROUNDS times after a warm-up round. Returns the bytes one round
    read and the median, over rounds, of the slowest destination's own time."""
    seconds = []
    moved = 0
    for i in range(ROUNDS + 1):
        done = await once()
        if i:
            seconds.append(max(m.seconds for m in done))
        moved = sum(m.nbytes for m in done)
    return moved, statistics.median(seconds)


async def demo(src: Worker, dst: Worker, transport: Transport | None) -> None:
    src_layouts = (await src.build.call(Shard(0), True)).item(procs=0)
    dst_layouts = (await dst.build.call(Shard(1), False)).item(procs=0)
    print("local shard shapes")
    for role, mesh in (("source", src), ("destination", dst)):
        for point, shapes in (await mesh.local_shapes.call()).items():
            print(f"  {role} rank {point['procs']}: {shapes}")

    # The controller can plan too: planning is a pure function of the two layouts.
    plan = PlanCache().get(src_layouts, dst_layouts)
    show_plan(plan, "tiny")

    async def overlap() -> list[Moved]:
        exports = list((await src.publish.call(src_layouts, dst_layouts, transport)).values())
        try:
            return list((await dst.pull.call(src_layouts, dst_layouts, exports)).values())
        finally:
            await src.release.call()

    handles = list((await src.share_shards.call(transport)).values())

    async def gather() -> list[Moved]:
        return list((await dst.gather.call(src_layouts, handles)).values())

    truth = {name: weights(name) for name in SHAPES}
    total = sum(t.numel() * t.element_size() for t in truth.values())
    results = {}
    for method, once in (("overlap", overlap), ("gather", gather)):
        await dst.reset.call()
        results[method] = await rounds(once)
        got = (await dst.full_tensors.call()).item(procs=0)
        expect(
            all(bit_equal(got[name], truth[name]) for name in SHAPES),
            f"{method}: the destination mesh's full_tensor() is bit-identical to the source",
        )

    (o_bytes, o_s), (g_bytes, g_s) = results["overlap"], results["gather"]
    mib = 2**20
    print(f"\nmoving both tensors ({total / mib:.1f} MiB) to {DESTINATIONS} destinations ", end="")
    print(f"(time: the slowest destination's own, median of {ROUNDS} rounds)")
    print(f"  overlap (this package): {o_bytes / mib:6.1f} MiB read, {o_s * 1e3:7.1f} ms")
    print(f"  gather, then slice:     {g_bytes / mib:6.1f} MiB read, {g_s * 1e3:7.1f} ms")
    print(f"  gather moved {g_bytes / o_bytes:.1f}x the bytes and took {g_s / o_s:.1f}x the time")
    expect(o_bytes == plan.bytes_moved == total, "overlap moved exactly the plan's bytes, once")
    expect(g_bytes == DESTINATIONS * total, "gather moved a full copy to every destination")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--transport", choices=["shm", "rdma"], default="shm", help="default: shm")
    args = parser.parse_args()
    transport = Transport(args.transport)

    # Two meshes, two separate gloo worlds: no process group contains both.
    meshes: list[ProcMesh] = []
    try:
        for name, n in (("trainer", SOURCES), ("generator", DESTINATIONS)):
            meshes.append(this_host().spawn_procs(per_host={"procs": n}, name=name))
            await setup_torch_elastic_env_async(meshes[-1])  # env vars for init_process_group
        src, dst = (mesh.spawn(f"{mesh_name}_w", Worker) for mesh_name, mesh in
                    zip(("trainer", "generator"), meshes, strict=True))  # fmt: skip
        try:
            await demo(src, dst, transport)
        finally:
            await asyncio.gather(src.close.call(), dst.close.call())
    finally:
        for mesh in meshes:
            await mesh.stop()


if __name__ == "__main__":
    asyncio.run(main())
