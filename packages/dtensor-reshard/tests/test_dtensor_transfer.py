"""Real DTensors in Monarch process meshes with gloo process groups, resharded by the package
and compared bit for bit with `full_tensor()`.

Meshes: `four` (4 processes) and `two` (2 processes) are distinct process sets, each its own
gloo world; `other_four` (4 processes) serves as the 2x2 source and as the co-located case.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio
import torch
from dtensor_reshard import Layout, Placement, PullStats
from monarch.actor import ProcMesh, this_host
from monarch.spmd import setup_torch_elastic_env_async
from rdma_tensor import Transport
from reshard_actors import SENTINEL, DTensorWorker, Spec, full, tiny_transformer
from torch.distributed.tensor import Replicate, Shard

# Several processes, seconds each: not in `nox -s fast`.
pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]


@dataclass
class Meshes:
    procs: list[ProcMesh]
    four: DTensorWorker
    two: DTensorWorker
    other_four: DTensorWorker


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def meshes() -> AsyncIterator[Meshes]:
    procs = [this_host().spawn_procs(per_host={"procs": n}) for n in (4, 2, 4)]
    try:
        workers = []
        for i, p in enumerate(procs):
            await setup_torch_elastic_env_async(p)
            worker = p.spawn(f"worker{i}", DTensorWorker)
            await worker.init_gloo.call()
            workers.append(worker)
        yield Meshes(procs, *workers)
    finally:
        for p in procs:
            await p.stop()


async def _transfer(
    src: DTensorWorker,
    dst: DTensorWorker,
    src_layouts: dict[str, Layout],
    dst_layouts: dict[str, Layout],
    *,
    colocated: bool = False,
    staged: bool = False,
    transport: Transport | None = None,
) -> list[PullStats]:
    """One version: sources publish, destinations pull, sources release."""
    published = await src.publish.call(src_layouts, dst_layouts, colocated, staged, transport)
    exports = list(published.values())
    try:
        stats = await dst.pull.call(src_layouts, dst_layouts, exports, colocated)
    finally:
        await src.release.call()
    return list(stats.values())


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)


def _bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bytes(a), _bytes(b))


async def _first(worker: DTensorWorker, role: str) -> dict[str, torch.Tensor]:
    """`full_tensor()` of every tensor (called on the whole mesh, as a collective)."""
    return next(iter((await worker.full_tensors.call(role)).values()))


@pytest.mark.parametrize(
    ("staged", "transport"), [(False, None), (True, None), (True, Transport.RDMA)]
)
async def test_shard0_on_four_to_shard1_on_two(
    meshes: Meshes, staged: bool, transport: Transport | None
) -> None:
    specs = {
        "w": Spec((10, 7), torch.float32, (4,), (Shard(0),), seed=1),  # uneven both ways
        "h": Spec((6, 9), torch.bfloat16, (4,), (Shard(0),), seed=2),
    }
    dst_specs = {n: Spec(s.shape, s.dtype, (2,), (Shard(1),)) for n, s in specs.items()}
    src_layouts = (await meshes.four.build.call("src", specs)).item(procs=0)
    dst_layouts = (await meshes.two.build.call("dst", dst_specs)).item(procs=0)

    stats = await _transfer(
        meshes.four, meshes.two, src_layouts, dst_layouts, staged=staged, transport=transport
    )

    got = await _first(meshes.two, "dst")
    sent = await _first(meshes.four, "src")
    for name, spec in specs.items():
        assert _bit_equal(got[name], sent[name]), name
        assert _bit_equal(got[name], full(spec)), name
    # Exactly the minimum crossed processes: each destination's whole shard, once.
    itemsize = {"w": 4, "h": 2}
    want = [sum(dst_layouts[n].local_box(r).numel * itemsize[n] for n in specs) for r in (0, 1)]
    assert [s.bytes_read for s in stats] == want
    assert [s.bytes_local for s in stats] == [0, 0]


async def test_two_by_two_to_four(meshes: Meshes) -> None:
    specs = {
        "grid": Spec((9, 6), torch.float32, (2, 2), (Shard(0), Shard(1)), seed=3),
        "rep": Spec((7, 5), torch.float32, (2, 2), (Replicate(), Shard(0)), seed=4),
        "nested": Spec((11,), torch.int64, (2, 2), (Shard(0), Shard(0)), seed=5),
    }
    dst_specs = {n: Spec(s.shape, s.dtype, (4,), (Shard(0),)) for n, s in specs.items()}
    src_layouts = (await meshes.other_four.build.call("src", specs)).item(procs=0)
    dst_layouts = (await meshes.four.build.call("dst", dst_specs)).item(procs=0)

    stats = await _transfer(meshes.other_four, meshes.four, src_layouts, dst_layouts)

    got = await _first(meshes.four, "dst")
    for name, spec in specs.items():
        assert _bit_equal(got[name], full(spec)), name
    numel = sum(t.numel() for t in got.values())
    assert sum(s.bytes_read for s in stats) == numel * 4 + 11 * 4  # int64 is 8 bytes


async def test_transformer_state_dict_across_versions(meshes: Meshes) -> None:
    state = tiny_transformer(seed=0).state_dict()
    src_place: dict[str, tuple[Placement, ...]] = {n: (Shard(0),) for n in state}
    dst_place: dict[str, tuple[Placement, ...]] = {
        n: (Shard(1),) if t.ndim == 2 else (Replicate(),) for n, t in state.items()
    }
    dst_layouts = (await meshes.two.build_model.call("dst", 99, (2,), dst_place)).item(procs=0)
    computed_before = (await meshes.two.plans_computed.call()).item(procs=0)
    computed = []
    for version, seed in enumerate((0, 1)):
        src_layouts = (await meshes.four.build_model.call("src", seed, (4,), src_place)).item(
            procs=0
        )
        await _transfer(meshes.four, meshes.two, src_layouts, dst_layouts)
        got = await _first(meshes.two, "dst")
        want = tiny_transformer(seed=seed).state_dict()
        assert set(got) == set(want)
        for name in want:
            assert _bit_equal(got[name], want[name]), (version, name)
        computed.append((await meshes.two.plans_computed.call()).item(procs=0))
    # Version 1 planned each distinct (source, destination) layout pair once, fewer than there
    # are parameters (equal shapes share a plan); version 2 reused every plan.
    assert 0 < computed[0] - computed_before < len(state)
    assert computed[1] == computed[0]


async def test_colocated_meshes_move_only_what_each_process_lacks(meshes: Meshes) -> None:
    spec = Spec((8, 12), torch.float32, (4,), (Shard(0),), seed=6)
    dst_spec = Spec((8, 12), torch.float32, (2, 2), (Shard(1), Shard(0)))
    src_layouts = (await meshes.other_four.build.call("src", {"w": spec})).item(procs=0)
    dst_layouts = (await meshes.other_four.build.call("dst", {"w": dst_spec})).item(procs=0)

    stats = await _transfer(
        meshes.other_four, meshes.other_four, src_layouts, dst_layouts, colocated=True
    )

    got = await _first(meshes.other_four, "dst")
    assert _bit_equal(got["w"], full(spec))
    # Rank r holds rows [2r, 2r+2); its destination block is 4 rows x 6 columns, of which the
    # 2 x 6 it already holds are copied in-process and the rest is read.
    assert [s.bytes_local for s in stats] == [48, 0, 0, 48]
    assert [s.bytes_read for s in stats] == [48, 96, 96, 48]
    assert SENTINEL not in got["w"]
