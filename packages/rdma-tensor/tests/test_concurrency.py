"""Many versions published while several readers pull at once: every state a reader ends up
with must be exactly one version (checked bit for bit against that version's data), whether
it copies the version (over shared memory or RDMA) or maps it in place."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import torch
from monarch.actor import ProcMesh
from rdma_tensor import (
    Publisher,
    PublisherClosedError,
    PublisherConfig,
    ReadResult,
    Subscriber,
    TensorHandle,
    Transport,
    pull,
)
from rdma_tensor._pull_shm import STATS
from sync_actors import Generator, Trainer, matches, version_state

LAST = 40


@pytest.mark.parametrize(
    ("readers", "slots"),
    [
        ([("copy", Transport.SHM), ("map", Transport.SHM), ("copy", Transport.RDMA)], 2),
        ([("map", Transport.SHM)] * 3, 4),
    ],
    ids=["copy-map-rdma", "three-mapped"],
)
async def test_no_torn_reads_while_publishing_continuously(
    procs: ProcMesh, readers: list[tuple[str, Transport]], slots: int
) -> None:
    """Mapping readers pin their version's slot until they move on, so the publisher needs
    slots >= mapping readers + 1 (PublisherConfig.slots); with them it never waits long."""
    config = PublisherConfig(slots=slots, bucket_bytes=16 << 10)
    name = "-".join(kind for kind, _ in readers)
    trainer = procs.slice(procs=0).spawn(f"trainer_{name}", Trainer, config)
    generators = [
        procs.slice(procs=i + 1).spawn(f"reader{i}_{name}", Generator, module=kind == "map")
        for i, (kind, _) in enumerate(readers)
    ]
    first = await trainer.publish.call_one(1)
    for reader in generators:  # up and running before the publisher starts its run
        assert await reader.current_version.call_one() is None
    follows = [
        g.follow.call_one(first, LAST, t) for g, (_, t) in zip(generators, readers, strict=True)
    ]
    # Publish faster than an RDMA reader can copy, so its slot is regularly rewritten
    # under it (it must notice and retry) while shared-memory readers hold leases.
    longest_stall = await trainer.publish_many.call_one(2, LAST, 0.005)
    seen = await asyncio.gather(*follows)
    for versions, who in zip(seen, readers, strict=True):
        assert versions[-1] == LAST, who
        assert versions == sorted(set(versions)), who
    assert sum(len(v) for v in seen) > len(readers)  # readers saw intermediate versions
    assert longest_stall < 5.0  # publish never waited out its 30 s busy timeout
    for generator, (kind, _) in zip(generators, readers, strict=True):
        assert await generator.is_mapped.call_one() is (kind == "map")
    await trainer.close_publisher.call_one()


def test_checker_detects_a_torn_state() -> None:
    """The check the readers run does catch a mix of two versions."""
    state = version_state(3)
    assert matches(state, 3)
    state["head"] = version_state(4)["head"]
    assert not matches(state, 3)
    assert not matches(state, 4)
    state = version_state(3)
    state["embed"][0, 0] = torch.nextafter(state["embed"][0, 0], torch.tensor(1e9))
    assert not matches(state, 3)


async def test_rdma_reader_discards_a_slot_rewritten_under_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Deterministic version of the race above: while an RDMA reader copies version 1's
    buckets, the publisher rewrites that very slot; the reader must notice (the slot's
    sequence number moved), throw the bytes away and return a whole newer version."""
    publisher = Publisher(PublisherConfig(bucket_bytes=16 << 10))
    state = version_state(1)
    manifest = publisher.publish(state, 1)
    target = {h.uid for h in manifest.slots[manifest.slot].buckets}
    original = TensorHandle.read_into
    rewrites: list[int] = []

    async def read_then_publish(self: TensorHandle, dst: torch.Tensor, **kw: Any) -> ReadResult:
        result = await original(self, dst, **kw)
        if self.uid in target and not rewrites:
            for version in (2, 3):  # version 3 lands in version 1's slot
                rewrites.append(publisher.publish(version_state(version), version).slot)
        return result

    monkeypatch.setattr(TensorHandle, "read_into", read_then_publish)
    into = {n: torch.zeros_like(t) for n, t in state.items()}
    result = await pull(manifest, into=into, transport=Transport.RDMA)
    assert rewrites[-1] == manifest.slot
    assert result.retries >= 1
    assert result.version == 3
    assert matches(into, 3)
    publisher.close()


async def test_pipelined_pull_copies_buckets_as_they_are_staged() -> None:
    """A reader waiting for the next version copies each bucket as soon as the publisher
    marks it written (the publisher here is a thread staging one bucket every 30 ms)."""
    publisher = Publisher(PublisherConfig(bucket_bytes=16 << 10))
    first = publisher.publish(version_state(1), 1)
    into = {n: torch.zeros_like(t) for n, t in version_state(1).items()}
    subscriber = Subscriber(into)  # knows it holds version 1, so it can fall back on it
    await subscriber.pull(first)
    slot, second, tensors = publisher._begin(version_state(2), 2)
    n_buckets = len(first.bucket_layout.bucket_nbytes)
    marked: list[float] = []

    def stage() -> None:
        for k in range(n_buckets):
            time.sleep(0.03)
            publisher._write(slot, tensors, buckets=[k])
            marked.append(time.perf_counter())
        publisher._commit(slot, second)

    before = STATS.pipelined
    thread = threading.Thread(target=stage)
    thread.start()
    result = await subscriber.pull(first, min_version=2)
    done = time.perf_counter()
    thread.join()
    assert result.version == 2
    assert STATS.pipelined == before + 1
    assert matches(into, 2)
    # It finished right after the last bucket was staged, not after a full copy later.
    assert done - marked[-1] < 0.5
    publisher.close()


async def test_pipelined_pull_undoes_its_copies_when_the_publisher_closes_mid_version() -> None:
    publisher = Publisher(PublisherConfig(bucket_bytes=16 << 10))
    first = publisher.publish(version_state(1), 1)
    into = {n: torch.zeros_like(t) for n, t in version_state(1).items()}
    subscriber = Subscriber(into)
    await subscriber.pull(first)
    slot, _, tensors = publisher._begin(version_state(2), 2)
    publisher._write(slot, tensors, buckets=[0])
    closer = threading.Timer(0.2, publisher.close)
    rollbacks = STATS.rollbacks
    closer.start()
    with pytest.raises(PublisherClosedError):
        await subscriber.pull(first, min_version=2)
    closer.join()
    assert STATS.rollbacks == rollbacks + 1
    assert matches(into, 1)  # bucket 0 of version 2 was copied, then restored
