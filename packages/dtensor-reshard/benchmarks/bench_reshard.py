"""Benchmark: resharding by overlap (this package) against gather-then-slice, in one run.

For each case a source mesh of Monarch processes holds a float32 tensor (1 GiB; 256 MiB with
`--quick`) sharded one way, and a destination mesh wants it sharded another way:

    S0x2->S1x2   Shard(0) on 2 ranks        -> Shard(1) on 2 ranks
    S0x4->Rx2    Shard(0) on 4 ranks        -> Replicate() on 2 ranks
    2x2->4       (Shard(0), Shard(1)) on 2x2 -> Shard(0) on 4 ranks

Two methods move it, over the same transport (`--transport`):

    overlap   `PlanPublisher` + `pull_plan`: each destination copies only the boxes it needs.
    gather    each destination reads every distinct source shard into a full-size buffer
              (`TensorHandle.read_into`; the buffer is allocated once, outside the timing),
              then copies its own slice out of it.

With `shm` (same machine, the default) overlap runs in direct mode: destinations copy their
boxes straight out of the sources' shared shards. With `rdma` it runs staged: sources pack
per-destination buffers that destinations read whole. Both methods share the source shards
once before timing (a trainer's weights stay shared); each timed round runs from the
sources' publish to the last destination's completion. Every round's result is checked
against the expected values. Reported: bytes moved (summed over destinations) and the
median seconds of `--repeats` rounds after one warm-up round.

Run:
    uv run python packages/dtensor-reshard/benchmarks/bench_reshard.py --quick
    uv run python packages/dtensor-reshard/benchmarks/bench_reshard.py --json out.json
    uv run nox -s "bench(package='dtensor-reshard')" -- --quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from dtensor_reshard import (
    Box,
    Layout,
    PlanCache,
    PlanPublisher,
    PullStats,
    ReshardPlan,
    SourceExport,
    pull_plan,
)
from monarch.actor import Actor, ProcMesh, endpoint, this_host
from rdma_tensor import SharedTensor, TensorHandle, Transport, share
from torch.distributed.tensor import Replicate, Shard

MOD = 65_521  # pattern values stay below 2**24, exact in float32


def pattern(box: Box) -> torch.Tensor:
    """The expected values of a 2-D global box: (31 * row + 17 * col) mod MOD, as float32."""
    rows = torch.arange(box.offsets[0], box.ends[0], dtype=torch.int64)[:, None] * 31
    cols = torch.arange(box.offsets[1], box.ends[1], dtype=torch.int64)[None, :] * 17
    return ((rows + cols) % MOD).to(torch.float32)


def fill_pattern(out: torch.Tensor, box: Box, rows_per_chunk: int = 1024) -> None:
    """Writes `pattern(box)` into `out` a band of rows at a time (bounded temporary memory)."""
    for r in range(0, box.sizes[0], rows_per_chunk):
        n = min(rows_per_chunk, box.sizes[0] - r)
        band = Box((box.offsets[0] + r, box.offsets[1]), (n, box.sizes[1]))
        out[r : r + n].copy_(pattern(band))


def matches_pattern(out: torch.Tensor, box: Box, rows_per_chunk: int = 1024) -> bool:
    for r in range(0, box.sizes[0], rows_per_chunk):
        n = min(rows_per_chunk, box.sizes[0] - r)
        band = Box((box.offsets[0] + r, box.offsets[1]), (n, box.sizes[1]))
        if not torch.equal(out[r : r + n], pattern(band)):
            return False
    return True


class BenchWorker(Actor):
    """One process: a source shard or a destination shard, and both methods' two sides."""

    def __init__(self) -> None:
        self.shard = torch.empty(0)
        self.layout: Layout | None = None
        self.rank = 0
        self.cache = PlanCache()
        self.publisher: PlanPublisher | None = None
        self.shared: SharedTensor | None = None
        self.full = torch.empty(0)

    @endpoint
    async def setup(self, layout: Layout, rank: int, source: bool) -> None:
        self.close_all()
        self.layout, self.rank = layout, rank
        box = layout.local_box(rank)
        self.shard = torch.empty(box.sizes, dtype=layout.dtype)
        if source:
            fill_pattern(self.shard, box)
        else:
            self.shard.fill_(-1.0)
            # gather's full-size buffer, allocated and touched once so that no round pays
            # for page faults: the baseline at its best.
            self.full = torch.zeros(layout.global_shape, dtype=layout.dtype)

    # ---- overlap (this package)
    @endpoint
    async def publish(self, src: Layout, dst: Layout, transport: Transport | None) -> SourceExport:
        plan = self.cache.get({"x": src}, {"x": dst})
        if self.publisher is None:
            staged = transport is Transport.RDMA
            self.publisher = PlanPublisher(self.rank, staged=staged, transport=transport)
        return self.publisher.publish(plan, {"x": self.shard})

    @endpoint
    async def release(self) -> None:
        if self.publisher is not None:
            self.publisher.release()

    @endpoint
    async def pull(self, src: Layout, dst: Layout, exports: list[SourceExport]) -> PullStats:
        plan: ReshardPlan = self.cache.get({"x": src}, {"x": dst})
        return await pull_plan(plan, self.rank, exports, {"x": self.shard})

    # ---- gather, then slice
    @endpoint
    async def share_shard(self, transport: Transport | None) -> TensorHandle:
        if self.shared is None:
            self.shared = share(self.shard, transport=transport)
        return self.shared.handle

    @endpoint
    async def gather(self, src: Layout, handles: list[TensorHandle]) -> int:
        """Reads one copy of every distinct source shard into a full buffer, then slices."""
        assert self.layout is not None
        full = self.full
        seen: set[Box] = set()
        reads = []
        for rank, handle in enumerate(handles):
            box = src.local_box(rank)
            if box.numel > 0 and box not in seen:
                seen.add(box)
                reads.append(handle.read_into(box.view(full)))
        results = await asyncio.gather(*reads)
        self.shard.copy_(self.layout.local_box(self.rank).view(full))
        return sum(r.nbytes for r in results)

    @endpoint
    async def check_and_reset(self) -> bool:
        assert self.layout is not None
        ok = matches_pattern(self.shard, self.layout.local_box(self.rank))
        self.shard.fill_(-1.0)
        return ok

    def close_all(self) -> None:
        if self.publisher is not None:
            self.publisher.close()
            self.publisher = None
        if self.shared is not None:
            self.shared.close()
            self.shared = None
        self.cache = PlanCache()
        self.full = torch.empty(0)

    @endpoint
    async def close(self) -> None:
        self.close_all()


@dataclass(frozen=True)
class Row:
    """One result: `bytes_moved` summed over destinations; `seconds` the median round."""

    case: str
    method: str
    bytes_moved: int
    seconds: float


@dataclass(frozen=True)
class Case:
    name: str
    src: Layout
    dst: Layout


def cases(n: int) -> list[Case]:
    f32 = torch.float32
    shape = (n, n)
    return [
        Case(
            "S0x2->S1x2",
            Layout(shape, f32, (2,), (Shard(0),)),
            Layout(shape, f32, (2,), (Shard(1),)),
        ),
        Case(
            "S0x4->Rx2",
            Layout(shape, f32, (4,), (Shard(0),)),
            Layout(shape, f32, (2,), (Replicate(),)),
        ),
        Case(
            "2x2->4",
            Layout(shape, f32, (2, 2), (Shard(0), Shard(1))),
            Layout(shape, f32, (4,), (Shard(0),)),
        ),
    ]


async def timed(
    rounds: int, once: Callable[[], Awaitable[int]], check: Callable[[], Awaitable[None]]
) -> tuple[int, float]:
    """(bytes of the last round, median seconds) over `rounds` rounds after a warm-up."""
    times, moved = [], 0
    for i in range(rounds + 1):
        start = time.perf_counter()
        moved = await once()
        elapsed = time.perf_counter() - start
        await check()
        if i > 0:
            times.append(elapsed)
    return moved, statistics.median(times)


async def run_case(
    case: Case, srcs: BenchWorker, dsts: BenchWorker, transport: Transport | None, rounds: int
) -> list[Row]:
    src_actors = srcs.slice(procs=slice(0, case.src.num_ranks))
    dst_actors = dsts.slice(procs=slice(0, case.dst.num_ranks))
    sources = [srcs.slice(procs=r) for r in range(case.src.num_ranks)]
    destinations = [dsts.slice(procs=r) for r in range(case.dst.num_ranks)]
    await asyncio.gather(
        *(w.setup.call_one(case.src, r, True) for r, w in enumerate(sources)),
        *(w.setup.call_one(case.dst, r, False) for r, w in enumerate(destinations)),
    )

    async def check() -> None:
        ok = await dst_actors.check_and_reset.call()
        if not all(ok.values()):
            raise RuntimeError(f"{case.name}: a destination shard is wrong")

    async def overlap() -> int:
        exports = list((await src_actors.publish.call(case.src, case.dst, transport)).values())
        stats = await dst_actors.pull.call(case.src, case.dst, exports)
        await src_actors.release.call()
        return sum(s.bytes_read for s in stats.values())

    handles = list((await src_actors.share_shard.call(transport)).values())

    async def gather() -> int:
        moved = await dst_actors.gather.call(case.src, handles)
        return sum(moved.values())

    rows = []
    for method, once in (("overlap", overlap), ("gather", gather)):
        moved, seconds = await timed(rounds, once, check)
        rows.append(Row(case.name, method, moved, seconds))
    minimum = PlanCache().get({"x": case.src}, {"x": case.dst}).bytes_moved
    if rows[0].bytes_moved != minimum:
        raise RuntimeError(f"{case.name}: overlap moved {rows[0].bytes_moved} B, minimum {minimum}")
    await asyncio.gather(src_actors.close.call(), dst_actors.close.call())
    return rows


def report(case: Case, rows: list[Row]) -> None:
    overlap, gather = rows
    cells = [f"{r.method} {r.bytes_moved / 2**20:6.0f} MiB {r.seconds:7.3f} s" for r in rows]
    ratio = overlap.seconds / gather.seconds
    print(f"{case.name:11s} " + " | ".join(cells) + f" | time overlap/gather {ratio:.2f}")


async def run_all(n: int, transport: Transport, rounds: int) -> list[Row]:
    """Spawns a source and a destination mesh of 4 processes; cases use the first ranks."""
    procs: list[ProcMesh] = [this_host().spawn_procs(per_host={"procs": 4}) for _ in range(2)]
    rows: list[Row] = []
    try:
        srcs, dsts = (p.spawn(f"bench{i}", BenchWorker) for i, p in enumerate(procs))
        for case in cases(n):
            case_rows = await run_case(case, srcs, dsts, transport, rounds)
            report(case, case_rows)
            rows.extend(case_rows)
    finally:
        for p in procs:
            await p.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="256 MiB instead of 1 GiB")
    parser.add_argument("--json", metavar="PATH", help="write result rows as JSON")
    parser.add_argument("--transport", choices=["shm", "rdma"], default="shm")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per method")
    args = parser.parse_args()
    n = 8192 if args.quick else 16384
    transport = Transport(args.transport)
    print(
        f"tensor {n}x{n} float32 ({n * n * 4 / 2**20:.0f} MiB), transport {transport.value}, "
        f"median of {args.repeats} rounds after a warm-up, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f} at start"
    )
    rows = asyncio.run(run_all(n, transport, args.repeats))
    print(f"load average {os.getloadavg()[0]:.1f} at end")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
