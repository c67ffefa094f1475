"""Map mode between a trainer and generators in separate Monarch processes: the generator's
module runs on the publisher's staging memory (nothing copied), its slot stays pinned while it
does, and what map mode cannot do it refuses up front, or copies in "auto" mode."""

from __future__ import annotations

import pytest
import torch
from monarch.actor import ProcMesh
from rdma_tensor import Manifest, PublisherConfig, Transport
from sync_actors import Generator, Trainer, version_state


def slot_bytes(manifest: Manifest) -> int:
    """Bytes of one staging slot (header and buckets): what one lease pins."""
    region = manifest.slots[0].header.shm
    assert region is not None
    return region.file_nbytes


async def test_a_mapped_generator_keeps_its_version_while_the_publisher_goes_on(
    procs: ProcMesh,
) -> None:
    config = PublisherConfig(slots=3, bucket_bytes=32 << 10)
    trainer = procs.slice(procs=0).spawn("trainer_mapped", Trainer, config)
    generator = procs.slice(procs=1).spawn("generator_mapped", Generator, module=True)
    first = await trainer.publish.call_one(1)
    outcome = await generator.try_pull.call_one(first)
    result = outcome.result
    assert result is not None, outcome.message
    assert (result.version, result.transport, result.mapped) == (1, Transport.SHM, True)
    assert result.changed
    assert result.nbytes == first.nbytes
    assert await generator.holds.call_one(1)
    assert await generator.leased_bytes.call_one(first) == slot_bytes(first)
    # More versions than slots: the publisher writes around the pinned slot, never into it.
    for version in range(2, 8):
        assert await trainer.try_publish.call_one(version) == ""
    assert await generator.holds.call_one(1)
    # An old manifest still yields the newest version, mapped; the old slot is let go.
    outcome = await generator.try_pull.call_one(first)
    assert outcome.result is not None, outcome.message
    assert (outcome.result.version, outcome.result.mapped) == (7, True)
    assert await generator.holds.call_one(7)
    assert await generator.leased_bytes.call_one(first) == slot_bytes(first)  # one lease, not two
    latest = await trainer.latest_manifest.call_one()
    outcome = await generator.try_pull.call_one(latest)
    assert outcome.result is not None, outcome.message
    assert not outcome.result.changed
    # unmap: the same weights in the generator's own memory, nothing pinned any more.
    await generator.unmap.call_one()
    assert not await generator.is_mapped.call_one()
    assert await generator.holds.call_one(7)
    assert await generator.leased_bytes.call_one(first) == 0
    assert await trainer.try_publish.call_one(8) == ""
    outcome = await generator.try_pull.call_one(latest)
    assert outcome.result is not None
    assert (outcome.result.version, outcome.result.mapped) == (8, True)
    assert await generator.holds.call_one(8)
    await trainer.close_publisher.call_one()


async def test_map_mode_refuses_what_it_cannot_map_and_auto_copies_it(procs: ProcMesh) -> None:
    trainer = procs.slice(procs=0).spawn("trainer_map_refuse", Trainer)
    manifest = await trainer.publish.call_one(3)
    bf16 = {"dtype": torch.bfloat16, "module": True}
    strict = procs.slice(procs=1).spawn("generator_map_cast", Generator, mode="map", **bf16)
    outcome = await strict.try_pull.call_one(manifest, allow_cast=True)
    assert outcome.error == "MismatchError", outcome
    assert "mode='map'" in outcome.message
    assert "embed is torch.bfloat16, published torch.float32 (a cast copies)" in outcome.message
    assert not any(t.any() for t in (await strict.state_dict.call_one()).values())
    remote = procs.slice(procs=2).spawn("generator_map_rdma", Generator, mode="map", module=True)
    outcome = await remote.try_pull.call_one(manifest, transport=Transport.RDMA)
    assert outcome.error == "TransportError", outcome
    assert "needs the publisher's machine" in outcome.message
    assert not await remote.holds.call_one(3)
    # "auto" copies instead: a cast, and a transport that cannot map.
    auto = procs.slice(procs=1).spawn("generator_auto_cast", Generator, **bf16)
    outcome = await auto.try_pull.call_one(manifest, allow_cast=True)
    assert outcome.result is not None, outcome.message
    assert not outcome.result.mapped
    got = await auto.state_dict.call_one()
    assert all(torch.equal(got[n], t.bfloat16()) for n, t in version_state(3).items())
    auto_rdma = procs.slice(procs=2).spawn("generator_auto_rdma", Generator, module=True)
    outcome = await auto_rdma.try_pull.call_one(manifest, transport=Transport.RDMA)
    assert outcome.result is not None, outcome.message
    assert (outcome.result.transport, outcome.result.mapped) == (Transport.RDMA, False)
    assert outcome.result.adopted  # re-pointed to its own receive buffer (test_adopt.py)
    assert await auto_rdma.holds.call_one(3)
    await trainer.close_publisher.call_one()


async def test_every_slot_pinned_by_mapped_readers_makes_publish_fail_clearly(
    procs: ProcMesh,
) -> None:
    """Two mapping readers on two different versions pin both slots of a two-slot publisher
    (the slot math says: slots >= mapping readers + 1): publish gives up after its busy
    timeout, stages nothing, and succeeds once a reader lets go."""
    config = PublisherConfig(slots=2, bucket_bytes=32 << 10, busy_timeout_s=0.3)
    trainer = procs.slice(procs=0).spawn("trainer_pinned", Trainer, config)
    first_reader = procs.slice(procs=1).spawn("generator_pin1", Generator, module=True)
    second_reader = procs.slice(procs=2).spawn("generator_pin2", Generator, module=True)
    first = await trainer.publish.call_one(1)
    assert (await first_reader.try_pull.call_one(first)).result is not None
    second = await trainer.publish.call_one(2)
    assert (await second_reader.try_pull.call_one(second)).result is not None
    error = await trainer.try_publish.call_one(3)
    assert error.startswith("SlotsBusyError: all 2 staging slots"), error
    assert "version 3 was not staged" in error
    assert "PublisherConfig(slots=M + 1)" in error
    assert await trainer.latest_version.call_one() == 2
    assert await first_reader.holds.call_one(1)
    assert await second_reader.holds.call_one(2)
    await first_reader.unmap.call_one()  # its own copy of version 1; slot free again
    assert await trainer.try_publish.call_one(3) == ""
    assert await first_reader.holds.call_one(1)
    assert await second_reader.holds.call_one(2)
    outcome = await first_reader.try_pull.call_one(first)
    assert outcome.result is not None
    assert (outcome.result.version, outcome.result.mapped) == (3, True)
    await trainer.close_publisher.call_one()


async def test_mapped_weights_stay_usable_after_the_publisher_closes(procs: ProcMesh) -> None:
    trainer = procs.slice(procs=0).spawn("trainer_map_close", Trainer)
    generator = procs.slice(procs=1).spawn("generator_map_close", Generator, module=True)
    manifest = await trainer.publish.call_one(1)
    assert (await generator.try_pull.call_one(manifest)).result is not None
    assert await generator.leased_bytes.call_one(manifest) > 0
    await trainer.close_publisher.call_one()
    assert await generator.holds.call_one(1)  # the mapping outlives the close
    outcome = await generator.try_pull.call_one(manifest, min_version=2, timeout_s=10)
    assert outcome.error == "PublisherClosedError", outcome
    assert await generator.is_mapped.call_one()
    assert await generator.holds.call_one(1)
    await generator.unmap.call_one()
    assert await generator.holds.call_one(1)
    assert await generator.mapped_bytes.call_one(manifest) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
async def test_auto_mode_copies_into_a_cuda_module(procs: ProcMesh) -> None:
    trainer = procs.slice(procs=0).spawn("trainer_map_cuda", Trainer)
    generator = procs.slice(procs=1).spawn(
        "generator_auto_cuda", Generator, module=True, device="cuda"
    )
    manifest = await trainer.publish.call_one(2)
    outcome = await generator.try_pull.call_one(manifest)
    assert outcome.result is not None, outcome.message
    assert not outcome.result.mapped
    assert await generator.holds.call_one(2)
    await trainer.close_publisher.call_one()
