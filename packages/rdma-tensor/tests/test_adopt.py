""" "auto" mode over RDMA adopts: the version arrives in the subscriber's own receive buffer,
and once verified the module is re-pointed to views of it (nothing copied after the
transfer). The buffer is never received into again while a view of it lives; a free one is
reused. (RDMA is forced here; `test_cross_host.py` takes the path between two hosts.)"""

from __future__ import annotations

import torch
from monarch.actor import ProcMesh
from rdma_tensor import PublisherConfig, Transport
from sync_actors import Generator, Trainer, version_state

BUCKETS = PublisherConfig(slots=3, bucket_bytes=32 << 10)


async def test_auto_adopts_over_rdma_and_reuses_free_receive_buffers(procs: ProcMesh) -> None:
    trainer = procs.slice(procs=0).spawn("trainer_adopt", Trainer, BUCKETS)
    generator = procs.slice(procs=1).spawn("generator_adopt", Generator, module=True)
    before = await generator.data_ptrs.call_one()
    for version in (1, 2, 3):
        manifest = await trainer.publish.call_one(version)
        outcome = await generator.try_pull.call_one(manifest, transport=Transport.RDMA)
        result = outcome.result
        assert result is not None, outcome.message
        assert (result.version, result.transport) == (version, Transport.RDMA)
        assert (result.adopted, result.mapped) == (True, False)
        assert result.nbytes == manifest.nbytes
        assert await generator.holds.call_one(version)
        # One buffer holds the weights; the previous one is free again from the second pull.
        assert await generator.free_receive_buffers.call_one() == (0 if version == 1 else 1)
    after = await generator.data_ptrs.call_one()
    assert all(after[n] != before[n] for n in before)  # re-pointed, not copied into
    # Adopted weights are the generator's own, writable memory (mapped ones are read-only).
    await generator.add_in_place.call_one(0.5)  # would kill the process if mapped
    assert not await generator.holds.call_one(3)  # the write landed
    manifest = await trainer.publish.call_one(5)
    outcome = await generator.try_pull.call_one(manifest, transport=Transport.RDMA)
    assert outcome.result is not None, outcome.message
    assert outcome.result.adopted
    assert await generator.holds.call_one(5)
    await trainer.close_publisher.call_one()


async def test_a_kept_weight_keeps_its_buffer_and_its_values(procs: ProcMesh) -> None:
    trainer = procs.slice(procs=0).spawn("trainer_adopt_kept", Trainer, BUCKETS)
    generator = procs.slice(procs=1).spawn("generator_adopt_kept", Generator, module=True)

    async def pull(version: int) -> None:
        manifest = await trainer.publish.call_one(version)
        outcome = await generator.try_pull.call_one(manifest, transport=Transport.RDMA)
        assert outcome.result is not None, outcome.message
        assert outcome.result.adopted
        assert await generator.holds.call_one(version)

    await pull(1)
    await generator.keep.call_one("embed")  # a caller holds on to a version-1 weight
    await pull(2)
    assert await generator.free_receive_buffers.call_one() == 0  # version 1's is still used
    await pull(3)  # so this one arrives in a third buffer, not in version 1's
    assert await generator.free_receive_buffers.call_one() == 1  # version 2's
    assert await generator.kept_holds.call_one(1)  # unchanged by two later pulls; now dropped
    assert await generator.free_receive_buffers.call_one() == 2  # version 1's came back
    await trainer.close_publisher.call_one()


async def test_copy_mode_and_casts_over_rdma_copy_into_the_same_tensors(procs: ProcMesh) -> None:
    trainer = procs.slice(procs=0).spawn("trainer_adopt_copy", Trainer, BUCKETS)
    manifest = await trainer.publish.call_one(1)
    cases = {
        "copy mode": {"module": True, "mode": "copy"},
        "a cast": {"module": True, "dtype": torch.bfloat16},
    }
    for i, (case, kwargs) in enumerate(cases.items()):
        generator = procs.slice(procs=1).spawn(f"generator_adopt_copy{i}", Generator, **kwargs)
        before = await generator.data_ptrs.call_one()
        outcome = await generator.try_pull.call_one(
            manifest, transport=Transport.RDMA, allow_cast=True
        )
        assert outcome.result is not None, (case, outcome.message)
        assert (outcome.result.adopted, outcome.result.mapped) == (False, False), case
        assert await generator.data_ptrs.call_one() == before, case
        got = await generator.state_dict.call_one()
        for name, want in version_state(1).items():
            assert torch.equal(got[name], want.to(got[name].dtype)), (case, name)
    await trainer.close_publisher.call_one()
