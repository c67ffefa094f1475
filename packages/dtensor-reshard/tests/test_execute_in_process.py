"""`PlanPublisher` and `pull_plan` end to end inside one process (rdma-tensor serves same-process
reads), over random layouts, strided destinations, and every kind of bad input."""

from __future__ import annotations

from collections.abc import Callable
from math import prod
from typing import Any

import pytest
import torch
from dtensor_reshard import (
    Layout,
    PlanCache,
    PlanPublisher,
    ReshardError,
    ReshardPlan,
    SourceExport,
    pull_plan,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rdma_tensor import StaleVersionError, Transport
from torch.distributed.tensor import Replicate, Shard

TorchShards = Callable[[Layout, torch.Tensor], list[torch.Tensor]]
SENTINEL = -7


def _publish(
    plan: ReshardPlan, sources: list[dict[str, torch.Tensor]], staged: bool
) -> tuple[list[PlanPublisher], list[SourceExport]]:
    publishers = [PlanPublisher(r, staged=staged) for r in range(plan.num_src_ranks)]
    return publishers, [p.publish(plan, s) for p, s in zip(publishers, sources, strict=True)]


@st.composite
def cases(draw: st.DrawFn) -> tuple[Layout, Layout, bool]:
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=ndim, max_size=ndim)))

    def layout() -> Layout:
        mesh = draw(st.sampled_from([(1,), (2,), (3,), (4,), (2, 2), (1, 3), (3, 2)]))
        options: list[Shard | Replicate] = [Replicate(), *(Shard(d) for d in range(ndim))]
        return Layout(
            shape, torch.float32, mesh, tuple(draw(st.sampled_from(options)) for _ in mesh)
        )

    return layout(), layout(), draw(st.booleans())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
async def test_random_layouts_both_modes(
    torch_shards: TorchShards, case: tuple[Layout, Layout, bool]
) -> None:
    src, dst, staged = case
    full = torch.randn(src.global_shape)
    plan = PlanCache().get({"x": src}, {"x": dst})
    sources = [{"x": t} for t in torch_shards(src, full)]
    publishers, exports = _publish(plan, sources, staged)
    want = torch_shards(dst, full)
    read = 0
    for rank in range(dst.num_ranks):
        out = torch.full(dst.local_shape(rank), float(SENTINEL))
        stats = await pull_plan(plan, rank, exports, {"x": out})
        assert torch.equal(out, want[rank])
        read += stats.bytes_read
    assert read == plan.bytes_moved
    for p in publishers:
        p.close()


async def test_strided_destination_and_staging_reuse_across_versions() -> None:
    src = Layout((6, 8), torch.float32, (2,), (Shard(0),))
    dst = Layout((6, 8), torch.float32, (2,), (Shard(1),))
    plan = PlanCache().get({"x": src}, {"x": dst})
    publishers = [PlanPublisher(r, staged=True) for r in range(2)]
    # Destination shards that are transposed views: every box written is non-contiguous.
    outs = [torch.zeros(4, 6).t() for _ in range(2)]
    assert not outs[0].is_contiguous()
    handles = []
    for version in range(3):
        full = torch.arange(48, dtype=torch.float32).reshape(6, 8) * (version + 1)
        exports = [
            p.publish(plan, {"x": src.local_shard(r, full).clone()})
            for r, p in enumerate(publishers)
        ]
        handles.append([h.uid for e in exports for _, _, h in e.buffers])
        for rank in range(2):
            await pull_plan(plan, rank, exports, {"x": outs[rank]})
            assert torch.equal(outs[rank], dst.local_shard(rank, full))
        for p in publishers:
            p.release()
    assert handles[0] == handles[1] == handles[2]  # the same staging buffers every version
    for p in publishers:
        p.close()


async def test_a_released_and_repacked_export_is_refused_before_any_write() -> None:
    src = Layout((6, 8), torch.float32, (2,), (Shard(0),))
    dst = Layout((6, 8), torch.float32, (1,), (Replicate(),))
    plan = PlanCache().get({"x": src}, {"x": dst})
    publishers = [PlanPublisher(r, staged=True) for r in range(2)]
    full = torch.arange(48, dtype=torch.float32).reshape(6, 8)
    shards = [{"x": src.local_shard(r, full).clone()} for r in range(2)]
    old = [p.publish(plan, shard) for p, shard in zip(publishers, shards, strict=True)]
    publishers[1].release()  # rank 1's buffers go back to its pool...
    publishers[1].publish(plan, {"x": src.local_shard(1, -full).clone()})  # ...and are repacked
    out = torch.full((6, 8), float(SENTINEL))
    with pytest.raises(StaleVersionError, match="source rank 1's staging buffers"):
        await pull_plan(plan, 0, old, {"x": out})
    assert bool((out == SENTINEL).all()), "a refused pull changed the destination"
    for p in publishers:
        p.close()


async def test_replicated_destinations_read_one_shared_buffer() -> None:
    src = Layout((8, 6), torch.float32, (2,), (Shard(0),))
    dst = Layout((8, 6), torch.float32, (3,), (Replicate(),))
    plan = PlanCache().get({"x": src}, {"x": dst})
    full = torch.randn(8, 6)
    shards = [{"x": src.local_shard(r, full).clone()} for r in range(2)]
    publishers, exports = _publish(plan, shards, staged=True)
    for export in exports:
        assert len({h.uid for _, _, h in export.buffers}) == 1  # packed once for 3 readers
    for rank in range(3):
        out = torch.zeros(8, 6)
        stats = await pull_plan(plan, rank, exports, {"x": out})
        assert torch.equal(out, full)
        assert stats.bytes_read == 8 * 6 * 4
    for p in publishers:
        p.close()


async def test_direct_mode_reads_the_live_source() -> None:
    # Direct mode shares the shard in place: a change after publish is what readers see.
    src = Layout((4,), torch.int64, (1,), (Replicate(),))
    dst = Layout((4,), torch.int64, (2,), (Shard(0),))
    plan = PlanCache().get({"x": src}, {"x": dst})
    shard = torch.arange(4)
    publisher = PlanPublisher(0, staged=False)
    exports = [publisher.publish(plan, {"x": shard})]
    shard.add_(10)
    out = torch.zeros(2, dtype=torch.int64)
    await pull_plan(plan, 1, exports, {"x": out})
    assert out.tolist() == [12, 13]
    publisher.close()


class _Setup:
    def __init__(self, staged: bool) -> None:
        self.src = {"w": Layout((4, 6), torch.float32, (2,), (Shard(0),))}
        self.dst = {"w": Layout((4, 6), torch.float32, (3,), (Shard(1),))}
        self.plan = PlanCache().get(self.src, self.dst)
        self.full = torch.randn(4, 6)
        sources = [{"w": self.src["w"].local_shard(r, self.full).clone()} for r in range(2)]
        self.publishers, self.exports = _publish(self.plan, sources, staged)
        self.out = torch.full((4, 2), float(SENTINEL))

    def close(self) -> None:
        for p in self.publishers:
            p.close()


@pytest.mark.parametrize("staged", [False, True])
async def test_bad_pulls_fail_before_any_byte_moves(staged: bool) -> None:
    s = _Setup(staged)
    other = PlanCache().get(s.src, {"w": Layout((4, 6), torch.float32, (3,), (Shard(0),))})
    foreign = PlanPublisher(0, staged=staged).publish(
        other, {"w": s.src["w"].local_shard(0, s.full).clone()}
    )
    bad: list[tuple[tuple[Any, ...], str]] = [
        ((s.plan, 3, s.exports, {"w": s.out}), "destination rank 3 is outside the mesh"),
        ((s.plan, 0, s.exports, {"w": torch.zeros(4, 3)}), r"is \(4, 3\) torch.float32, but"),
        ((s.plan, 0, s.exports, {"w": s.out.double()}), "expects local shape"),
        ((s.plan, 0, s.exports, {"v": s.out}), r"missing \['w'\], extra \['v'\]"),
        ((s.plan, 0, s.exports[:1], {"w": s.out}), r"got ranks \[0\]"),
        ((s.plan, 0, [s.exports[0], s.exports[0]], {"w": s.out}), r"got ranks \[0, 0\]"),
        ((s.plan, 0, [foreign, s.exports[1]], {"w": s.out}), "disagree on a layout"),
    ]
    for args, message in bad:
        with pytest.raises(ReshardError, match=message):
            await pull_plan(*args)
        assert bool((s.out == SENTINEL).all()), "a rejected pull changed the destination"
    s.close()


async def test_pull_after_release_fails_cleanly_in_direct_and_staged() -> None:
    for staged in (False, True):
        s = _Setup(staged)
        for p in s.publishers:
            p.close()
        with pytest.raises(Exception, match="closed"):
            await pull_plan(s.plan, 0, s.exports, {"w": s.out})


def test_bad_publishes_fail_before_anything_is_shared() -> None:
    s = _Setup(staged=True)
    layout = s.src["w"]
    with pytest.raises(ReshardError, match="source rank 2 is outside the mesh"):
        PlanPublisher(2).publish(s.plan, {"w": torch.zeros(2, 6)})
    with pytest.raises(ReshardError, match=r"source tensor 'w' on rank 0 is \(3, 6\)"):
        PlanPublisher(0).publish(s.plan, {"w": torch.zeros(3, 6)})
    publisher = PlanPublisher(0, staged=False)
    strided = torch.zeros(6, 2).t()
    assert tuple(strided.shape) == layout.local_shape(0)
    with pytest.raises(ReshardError, match="'w' is not contiguous"):
        publisher.publish(s.plan, {"w": strided})
    assert not publisher._shards  # nothing was shared
    with pytest.raises(ReshardError, match="with RDMA use staged=True"):
        PlanPublisher(0, staged=False, transport=Transport.RDMA)
    s.close()


async def test_colocated_pieces_are_copied_in_process() -> None:
    world = (0, 1)
    src = {"w": Layout((4, 4), torch.float32, (2,), (Shard(0),), world)}
    dst = {"w": Layout((4, 4), torch.float32, (2,), (Shard(1),), world)}
    plan = PlanCache().get(src, dst, colocated=True)
    full = torch.randn(4, 4)
    sources = [{"w": src["w"].local_shard(r, full).clone()} for r in range(2)]
    publishers, exports = _publish(plan, sources, staged=True)
    out = torch.zeros(4, 2)
    stats = await pull_plan(plan, 0, exports, {"w": out})
    assert torch.equal(out, full[:, :2])
    assert (stats.bytes_local, stats.bytes_read) == (2 * 2 * 4, 2 * 2 * 4)
    publishers[0].release()  # the co-located source is gone: its local piece cannot be served
    with pytest.raises(ReshardError, match="co-located source rank 0 has no live export"):
        await pull_plan(plan, 0, exports, {"w": out})
    for p in publishers:
        p.close()
    assert prod(out.shape) == 8


async def test_direct_mode_shares_replaced_tensors_anew() -> None:
    # Version after version the source hands over *new* tensors (e.g. a rebuilt model): the
    # publisher must share each new one, never serve a stale handle for an old one, even when
    # the allocator hands the new tensor an address an old one had before it was shared.
    src = Layout((64, 32), torch.float32, (1,), (Replicate(),))
    dst = Layout((64, 32), torch.float32, (2,), (Shard(1),))
    plan = PlanCache().get({"x": src}, {"x": dst})
    publisher = PlanPublisher(0, staged=False)
    for version in range(6):
        full = torch.full((64, 32), float(version))
        exports = [publisher.publish(plan, {"x": full})]
        out = torch.zeros(64, 16)
        await pull_plan(plan, 1, exports, {"x": out})
        assert bool((out == version).all()), f"version {version} read stale data"
        publisher.release()
        del full
    publisher.close()
