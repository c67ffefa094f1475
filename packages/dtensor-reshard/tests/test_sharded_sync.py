"""Versioned sharded weight sync end to end: `ShardedPublisher` on every rank of a real gloo
"trainer" mesh (3 Monarch processes, `Shard(0)` DTensors of a two-block transformer, uneven
shards included), `merge` on the controller, `pull` into an unsharded state dict in another
process and in this one. Bit for bit, all or nothing, and every bad input."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio
import torch
from dtensor_reshard import (
    Layout,
    ReshardError,
    ShardedManifest,
    ShardManifest,
    merge,
    pull,
)
from monarch.actor import ProcMesh, this_host
from monarch.spmd import setup_torch_elastic_env_async
from rdma_tensor import StaleVersionError
from reshard_actors import ShardedTrainerRank, UnshardedGenerator, version_weights
from torch.distributed.tensor import Replicate, Shard

# Several processes, seconds each: not in `nox -s fast`.
pytestmark = [pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

RANKS = 3  # the embedding's 50 rows split 17, 17, 16


@dataclass
class Job:
    procs: list[ProcMesh]
    trainer: ShardedTrainerRank
    generator: UnshardedGenerator


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def job() -> AsyncIterator[Job]:
    trainer_procs = this_host().spawn_procs(per_host={"procs": RANKS})
    generator_procs = this_host().spawn_procs(per_host={"procs": 1})
    procs = [trainer_procs, generator_procs]
    try:
        await setup_torch_elastic_env_async(trainer_procs)
        trainer = trainer_procs.spawn("trainer", ShardedTrainerRank)
        await trainer.setup.call()
        generator = generator_procs.spawn("generator", UnshardedGenerator)
        yield Job(procs, trainer, generator)
    finally:
        for p in procs:
            await p.stop()


async def publish(job: Job, version: int, seed: int | None = None) -> ShardedManifest:
    """One "optimizer step" to the weights of `seed` (default: `version`), then publish."""
    await job.trainer.step.call(version if seed is None else seed)
    return merge(await parts(job, version))


async def parts(job: Job, version: int) -> list[ShardManifest]:
    return list((await job.trainer.publish.call(version)).values())


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    same = a.dtype == b.dtype and a.shape == b.shape
    return same and torch.equal(_bytes(a), _bytes(b))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)


def zeros_like_weights(dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    return {n: torch.zeros_like(t, dtype=dtype) for n, t in version_weights(0).items()}


def staging_uids(manifest: ShardedManifest) -> set[str]:
    return {h.uid for e in manifest.exports for _, _, h in e.buffers}


async def test_publish_merge_pull_is_bit_exact_and_a_snapshot(job: Job) -> None:
    for version in (1, 2):
        manifest = await publish(job, version)
        assert manifest.version == version
        assert len(manifest.exports) == RANKS
        # The trainer steps on before the generator pulls: the version is a snapshot.
        await job.trainer.step.call(100 + version)
        got_version, bytes_read = await job.generator.update.call_one(manifest)
        assert (got_version, bytes_read) == (version, manifest.nbytes)  # each byte read once
        got = await job.generator.weights.call_one()
        want = version_weights(version)
        assert set(got) == set(want)
        for name in want:
            assert bit_equal(got[name], want[name]), (version, name)
        await job.trainer.release.call(version)


async def test_pull_here_casts_only_when_allowed(job: Job) -> None:
    manifest = await publish(job, 3)
    into = zeros_like_weights(torch.bfloat16)
    cast = r"dtype torch.bfloat16, published torch.float32; pass allow_cast=True"
    with pytest.raises(ReshardError, match=cast):
        await pull(manifest, into=into)
    assert not any(t.any() for t in into.values())
    result = await pull(manifest, into=into, allow_cast=True)
    assert result.version == 3
    for name, t in version_weights(3).items():
        assert torch.equal(into[name], t.bfloat16()), name
    await job.trainer.release.call(3)


async def test_bad_destinations_are_rejected_and_left_untouched(job: Job) -> None:
    manifest = await publish(job, 4)
    good = zeros_like_weights()
    embed = "0.weight"
    cases = {
        r"missing from into \['0.weight'\]": {n: t for n, t in good.items() if n != embed},
        r"not published \['extra'\]": {**good, "extra": torch.zeros(1)},
        r"0.weight: shape \[24, 50\], destination rank 0 holds \[50, 24\]": {
            **good,
            embed: torch.zeros(24, 50),
        },
        r"0.weight: not a tensor \(list\)": {**good, embed: [0.0]},
    }
    for message, into in cases.items():
        with pytest.raises(ReshardError, match=message):
            await pull(manifest, into=into)  # type: ignore[arg-type]
    with pytest.raises(ReshardError, match="destination rank 1 is outside the mesh"):
        await pull(manifest, into=good, dst_rank=1)
    with pytest.raises(TypeError, match="merge the ranks' parts"):
        await pull((await parts(job, 5))[0], into=good)  # type: ignore[arg-type]
    assert not any(t.any() for t in good.values()), "a rejected pull changed the destination"
    await job.trainer.release.call(5)


async def test_release_lets_staging_be_reused_and_a_reused_version_fails_cleanly(
    job: Job,
) -> None:
    first = await publish(job, 6)
    second = await publish(job, 7)
    assert not staging_uids(first) & staging_uids(second)  # not released: its own staging
    await job.trainer.release.call(7)
    third = await publish(job, 8)
    reused = staging_uids(third)
    assert reused in (staging_uids(first), staging_uids(second))  # packed again, no new memory
    stale = first if reused == staging_uids(first) else second
    into = zeros_like_weights()
    with pytest.raises(StaleVersionError, match="was released before this pull finished"):
        await pull(stale, into=into)
    assert not any(t.any() for t in into.values()), "a failed pull changed the destination"
    assert (await pull(third, into=into)).version == 8
    for name, t in version_weights(8).items():
        assert bit_equal(into[name], t), name
    await job.trainer.release.call(8)


async def test_merge_rejects_parts_that_do_not_make_one_version(job: Job) -> None:
    await job.trainer.step.call(9)
    ranks = sorted(await parts(job, 9), key=lambda p: p.rank)
    assert merge(list(reversed(ranks))).exports == tuple(p.export for p in ranks)
    other = dataclasses.replace(ranks[1], version=10)
    changed = dict(ranks[1].layouts)
    changed["4.bias"] = Layout((50,), torch.float16, (RANKS,), (Shard(0),))
    bad = {
        r"different versions: \[9, 10\]": [ranks[0], other, ranks[2]],
        r"got ranks \[0, 1\]": ranks[:2],
        r"got ranks \[0, 1, 1, 2\]": [*ranks, ranks[1]],
        "disagree on the layouts: '4.bias'": [
            ranks[0],
            dataclasses.replace(ranks[1], layouts=changed),
            ranks[2],
        ],
        "disagree on the destination": [
            ranks[0],
            ranks[1],
            dataclasses.replace(ranks[2], destination={}),
        ],
        "got none": [],
    }
    for message, given in bad.items():
        with pytest.raises(ReshardError, match=message):
            merge(given)
    await job.trainer.release.call(9)


async def test_bad_publishes_are_refused_before_anything_is_staged(job: Job) -> None:
    await publish(job, 11)
    expected = {
        "stale": r"StaleVersionError: version 0 is not newer than the last published 11",
        "negative": r"ValueError: version must be a non-negative int, got -1",
        "plain": r"ReshardError: 'extra' is a Tensor, not a DTensor",
        "empty": r"ReshardError: cannot publish an empty state dict",
        "wrong_rank": r"ReshardError: '.*': this process holds mesh rank 0 of it, but the "
        r"publisher was made for rank 1",
        "closed": r"PublisherClosedError: publish\(\) on a closed ShardedPublisher",
    }
    for case, pattern in expected.items():
        errors = (await job.trainer.publish_error.call(case)).values()
        if case == "wrong_rank":  # only rank 0's answer is known exactly
            errors = [next(iter(errors))]
        for error in errors:
            assert re.match(pattern, error), (case, error)
    # The refused version 12 can still be published: nothing was staged for it.
    manifest = await publish(job, 12)
    assert manifest.version == 12
    await job.trainer.release.call(12)


async def test_other_destination_layouts_pull_into_local_shards() -> None:
    """Planned toward a tensor-parallel generator: `Shard(1)` matrices over 2 ranks."""
    weights = version_weights(0)
    destination = {
        n: Layout(tuple(t.shape), t.dtype, (2,), (Shard(1),) if t.ndim == 2 else (Replicate(),))
        for n, t in weights.items()
    }
    procs = this_host().spawn_procs(per_host={"procs": 2})
    try:
        await setup_torch_elastic_env_async(procs)
        trainer = procs.spawn("trainer", ShardedTrainerRank)
        await trainer.setup.call(destination)
        await trainer.step.call(13)
        manifest = merge(list((await trainer.publish.call(13)).values()))
        assert manifest.destination == destination
        want = version_weights(13)
        for rank in range(2):
            into = {n: torch.zeros(layout.local_shape(rank)) for n, layout in destination.items()}
            result = await pull(manifest, into=into, dst_rank=rank)
            assert result.nbytes == sum(t.numel() * 4 for t in into.values())
            for name, layout in destination.items():
                assert bit_equal(into[name], layout.local_shard(rank, want[name])), (rank, name)
    finally:
        await procs.stop()
