"""publish / pull between a trainer and generators in separate Monarch processes: round
trips, casts, every bad input, and what each leaves behind (nothing)."""

from __future__ import annotations

import pytest
import torch
from monarch.actor import ProcMesh
from rdma_tensor import (
    MismatchError,
    Publisher,
    PublisherClosedError,
    PublisherConfig,
    SlotsBusyError,
    StaleVersionError,
    Transport,
    pull,
)
from rdma_tensor import _shm as shm
from sync_actors import SHAPES, Generator, Trainer, base_state, matches, version_state

SMALL_BUCKETS = PublisherConfig(bucket_bytes=32 << 10)  # several buckets for the test state


def spawn_trainer(procs: ProcMesh, name: str, device: str = "cpu") -> Trainer:
    return procs.slice(procs=0).spawn(name, Trainer, SMALL_BUCKETS, device)


def spawn_generator(procs: ProcMesh, name: str, **kwargs: object) -> Generator:
    return procs.slice(procs=1).spawn(name, Generator, **kwargs)


@pytest.mark.parametrize("transport", [Transport.SHM, Transport.RDMA])
async def test_round_trip_is_bit_exact(procs: ProcMesh, transport: Transport) -> None:
    trainer = spawn_trainer(procs, f"trainer_{transport.value}")
    generator = spawn_generator(procs, f"generator_{transport.value}")
    for version in (1, 2):
        manifest = await trainer.publish.call_one(version)
        outcome = await generator.try_pull.call_one(manifest, transport=transport)
        assert outcome.result is not None, outcome.message
        assert (outcome.result.version, outcome.result.transport) == (version, transport)
        assert outcome.result.changed
        assert outcome.result.nbytes == manifest.nbytes
        assert await generator.holds.call_one(version)
    assert len(manifest.bucket_layout.bucket_nbytes) > 1
    # Pulling the version it already holds copies nothing.
    outcome = await generator.try_pull.call_one(manifest, transport=transport)
    assert outcome.result is not None
    assert not outcome.result.changed
    await trainer.close_publisher.call_one()


async def test_cast_on_the_way_and_non_contiguous_destinations(procs: ProcMesh) -> None:
    trainer = spawn_trainer(procs, "trainer_cast")
    generator = spawn_generator(procs, "generator_cast", dtype=torch.bfloat16, transposed=True)
    manifest = await trainer.publish.call_one(3)
    outcome = await generator.try_pull.call_one(manifest)
    assert outcome.error == "MismatchError"
    assert "allow_cast=True" in outcome.message
    outcome = await generator.try_pull.call_one(manifest, allow_cast=True)
    assert outcome.result is not None, outcome.message
    got = await generator.state_dict.call_one()
    for name, t in version_state(3).items():
        assert got[name].dtype == torch.bfloat16
        assert torch.equal(got[name], t.bfloat16())
    await trainer.close_publisher.call_one()


async def test_bad_destinations_are_rejected_and_leave_weights_unchanged(procs: ProcMesh) -> None:
    trainer = spawn_trainer(procs, "trainer_bad")
    generator = spawn_generator(procs, "generator_bad")
    first = await trainer.publish.call_one(1)
    assert (await generator.try_pull.call_one(first)).result is not None
    second = await trainer.publish.call_one(2)
    good = {n: torch.zeros(s) for n, s in SHAPES.items()}
    cases = {
        "missing from into: ['head']": {n: t for n, t in good.items() if n != "head"},
        "not published: ['extra']": {**good, "extra": torch.zeros(1)},
        "head: shape [64, 96], published [96, 64]": {**good, "head": torch.zeros(64, 96)},
        "embed: dtype torch.int32": {**good, "embed": torch.zeros(64, 96, dtype=torch.int32)},
    }
    for expected, into in cases.items():
        outcome = await generator.try_pull.call_one(second, into=into, allow_cast=True)
        assert outcome.error == "MismatchError", outcome
        assert expected in outcome.message, outcome
    assert await generator.holds.call_one(1)  # the generator's own weights never moved
    # A manifest older than what the weights hold.
    assert (await generator.try_pull.call_one(second)).result is not None
    outcome = await generator.try_pull.call_one(first)
    assert outcome.error == "StaleVersionError"
    assert "older than version 2 already" in outcome.message
    assert await generator.holds.call_one(2)
    await trainer.close_publisher.call_one()


@pytest.mark.parametrize("transport", [Transport.SHM, Transport.RDMA])
async def test_closed_publisher_fails_clearly(procs: ProcMesh, transport: Transport) -> None:
    trainer = spawn_trainer(procs, f"trainer_closed_{transport.value}")
    generator = spawn_generator(procs, f"generator_closed_{transport.value}")
    manifest = await trainer.publish.call_one(1)
    await trainer.close_publisher.call_one()
    outcome = await generator.try_pull.call_one(manifest, transport=transport, timeout_s=10)
    assert outcome.error == "PublisherClosedError", outcome
    assert not any(t.any() for t in (await generator.state_dict.call_one()).values())
    assert (
        await generator.mapped_bytes.call_one(manifest) == 0
    )  # nothing of the closed publisher kept


async def test_old_manifest_yields_the_newest_version_and_waits_for_min_version(
    procs: ProcMesh,
) -> None:
    trainer = spawn_trainer(procs, "trainer_newest")
    generator = spawn_generator(procs, "generator_newest")
    first = await trainer.publish.call_one(1)
    for v in (2, 3, 4):  # slot of version 1 is long reused
        await trainer.publish.call_one(v)
    outcome = await generator.try_pull.call_one(first)
    assert outcome.result is not None
    assert outcome.result.version == 4
    assert await generator.holds.call_one(4)
    outcome = await generator.try_pull.call_one(first, min_version=5, timeout_s=0.5)
    assert outcome.error == "PullTimeoutError"
    assert "version >= 5" in outcome.message
    assert 0.5 <= outcome.seconds < 5
    assert await generator.holds.call_one(4)
    await trainer.close_publisher.call_one()


@pytest.mark.parametrize("module", [False, True], ids=["state-dict", "module"])
async def test_actor_pair_pulls_the_latest_from_a_publisher_actor(
    procs: ProcMesh, module: bool
) -> None:
    """`WeightSubscriber` copies into a state dict, and maps a module's weights."""
    trainer = spawn_trainer(procs, f"trainer_pair_{module}")
    generator = spawn_generator(procs, f"generator_pair_{module}", module=module)
    assert await generator.current_version.call_one() is None
    await trainer.publish.call_one(7)
    result = await generator.update_weights.call_one(trainer)
    assert (result.version, result.mapped) == (7, module)
    assert await generator.current_version.call_one() == 7
    assert await generator.holds.call_one(7)
    await trainer.close_publisher.call_one()


def test_bad_publishes_are_rejected_before_staging() -> None:
    publisher = Publisher(SMALL_BUCKETS)
    state = base_state()
    manifest = publisher.publish(state, 5)
    with pytest.raises(StaleVersionError, match="not newer than the last published 5"):
        publisher.publish(state, 5)
    with pytest.raises(MismatchError, match=r"missing \['head'\]"):
        publisher.publish({n: t for n, t in state.items() if n != "head"}, 6)
    with pytest.raises(MismatchError, match=r"embed was torch.float32 \[64, 96\], now"):
        publisher.publish({**state, "embed": torch.zeros(64, 95)}, 6)
    with pytest.raises(MismatchError, match="not a tensor"):
        publisher.publish({**state, "embed": [1.0]}, 6)  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="non-negative int"):
        publisher.publish(state, -1)
    assert publisher.latest == manifest
    publisher.close()
    with pytest.raises(PublisherClosedError):
        publisher.publish(state, 6)
    with pytest.raises(ValueError, match="slots must be >= 2"):
        PublisherConfig(slots=1)
    with pytest.raises(MismatchError, match="empty state dict"):
        Publisher().publish({}, 1)


async def test_publish_skips_slots_leased_by_readers() -> None:
    """A reader copying from a slot holds a lease; the publisher writes elsewhere and, when
    every slot is leased, gives up after `busy_timeout_s` instead of tearing a read."""
    publisher = Publisher(PublisherConfig(slots=2, busy_timeout_s=0.05))
    state = base_state()
    m1 = publisher.publish(state, 1)
    _, fd1 = shm.local_view(m1.slots[m1.slot].header.owner.process, m1.slots[m1.slot].header.shm)  # type: ignore[arg-type]
    assert shm.try_lock(fd1, exclusive=False)  # a reader starts copying version 1
    m2 = publisher.publish(state, 2)
    m3 = publisher.publish(state, 3)  # must not reuse version 1's slot
    assert m2.slot == m3.slot != m1.slot
    other = m2.slots[m2.slot].header
    _, fd2 = shm.local_view(other.owner.process, other.shm)  # type: ignore[arg-type]
    assert shm.try_lock(fd2, exclusive=False)
    with pytest.raises(SlotsBusyError, match="stayed leased"):
        publisher.publish(state, 4)
    shm.unlock(fd1)
    shm.unlock(fd2)
    into = {n: torch.zeros_like(t) for n, t in state.items()}
    result = await pull(m1, into=into)
    assert result.version == 3
    assert matches(into, 0)
    publisher.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
async def test_cuda_trainer_to_cuda_generator_with_cast(procs: ProcMesh) -> None:
    """CUDA weights staged through page-locked staging memory, pulled into CUDA bf16 from
    the generator's own mapping of it, page-locked too."""
    trainer = spawn_trainer(procs, "trainer_cuda", device="cuda")
    generator = spawn_generator(procs, "generator_cuda", dtype=torch.bfloat16, device="cuda")
    manifest = await trainer.publish.call_one(2)
    outcome = await generator.try_pull.call_one(manifest, allow_cast=True)
    assert outcome.result is not None, outcome.message
    assert await generator.cuda_registered_bytes.call_one() > 0
    got = await generator.state_dict.call_one()
    for name, t in version_state(2).items():
        assert torch.equal(got[name], t.bfloat16())
    await trainer.close_publisher.call_one()
