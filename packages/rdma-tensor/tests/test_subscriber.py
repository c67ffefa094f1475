"""`Subscriber` and `pull` in one process: what state each keeps, tied weights, the swap's
all-or-nothing guarantee, and bad arguments. (Across processes: test_mapped.py and
test_weight_sync.py.)"""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from rdma_tensor import (
    MismatchError,
    Publisher,
    PublisherConfig,
    SlotsBusyError,
    StaleVersionError,
    Subscriber,
    _lease,
    pull,
)
from rdma_tensor.manifest import TensorEntry
from rdma_tensor.subscriber import _swap
from sync_actors import SHAPES, make_module, matches, version_state


@pytest.fixture
def publisher() -> Iterator[Publisher]:
    publisher = Publisher(PublisherConfig(bucket_bytes=32 << 10))
    yield publisher
    publisher.close()


class Tied(torch.nn.Module):
    """An embedding and an output head sharing one weight, as in tied-embedding LLMs."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight


async def test_pull_keeps_no_state_and_a_subscriber_does(publisher: Publisher) -> None:
    """`pull` copies every time and takes an old manifest as "at least that version";
    a `Subscriber` knows what it holds: skips it, refuses older, per destination object
    (a new model at the addresses of an old one starts from nothing)."""
    first = publisher.publish(version_state(1), 1)
    second = publisher.publish(version_state(2), 2)
    into = {n: torch.zeros(s) for n, s in SHAPES.items()}
    for manifest in (second, second, first):
        result = await pull(manifest, into=into)
        assert (result.version, result.changed, result.mapped) == (2, True, False)
    subscriber = Subscriber(into)
    assert subscriber.version is None
    assert (await subscriber.pull(second)).changed
    assert not (await subscriber.pull(second)).changed
    with pytest.raises(StaleVersionError, match="asked for version 1, older than version 2"):
        await subscriber.pull(first)
    fresh = Subscriber(into)  # same tensors, same addresses, but no history
    assert (await fresh.pull(first)).version == 2
    assert matches(into, 2)


async def test_tied_weights_stay_tied_when_mapped(publisher: Publisher) -> None:
    source = Tied()
    manifest = publisher.publish(source.state_dict(), 1)
    model = Tied()
    result = await Subscriber(model, mode="map").pull(manifest)
    assert result.mapped
    assert model.head.weight is model.embed.weight
    assert torch.equal(model.embed.weight, source.embed.weight)
    tokens = torch.tensor([[1, 2, 3]])
    assert torch.equal(model.head(model.embed(tokens)), source.head(source.embed(tokens)))


async def test_unmap_copies_into_own_memory_and_releases_the_lease(publisher: Publisher) -> None:
    gc.collect()
    leased = _lease.leased_bytes()
    manifest = publisher.publish(version_state(1), 1)
    model = make_module()
    subscriber = Subscriber(model)
    assert (await subscriber.pull(manifest)).mapped
    assert _lease.leased_bytes() > leased
    subscriber.unmap()
    assert _lease.leased_bytes() == leased
    assert not subscriber.mapped
    assert subscriber.version == 1
    assert matches(model.state_dict(), 1)
    with torch.no_grad():  # the weights are the generator's own again: writable
        next(model.parameters()).add_(1.0)


async def test_a_kept_reference_to_an_old_weight_keeps_its_slot_pinned() -> None:
    """The lease lives as long as any view of the version does, not as long as the
    subscriber says: a tensor kept from version 1 stays version 1, and its slot stays out of
    the publisher's reach until it is dropped."""
    publisher = Publisher(PublisherConfig(slots=2, busy_timeout_s=0.05))
    model = make_module()
    subscriber = Subscriber(model)
    await subscriber.pull(publisher.publish(version_state(1), 1))
    kept = model.get_parameter("embed").detach()  # shares version 1's memory
    await subscriber.pull(publisher.publish(version_state(2), 2))
    assert matches(model.state_dict(), 2)
    with pytest.raises(SlotsBusyError):  # slot of v1: kept; slot of v2: the model
        publisher.publish(version_state(3), 3)
    assert torch.equal(kept, version_state(1)["embed"])
    del kept
    gc.collect()
    assert publisher.publish(version_state(3), 3).version == 3
    assert matches(model.state_dict(), 2)
    publisher.close()


def test_writing_to_mapped_weights_kills_the_process(tmp_path: Path) -> None:
    """The documented sharp edge: mapped weights are read-only memory (SIGSEGV on write)."""
    script = tmp_path / "write.py"
    script.write_text(WRITE_TO_MAPPED)
    run = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    assert "mapped: True" in run.stdout, run.stdout + run.stderr[-2000:]
    assert "survived" not in run.stdout
    assert run.returncode == -signal.SIGSEGV, run.returncode


WRITE_TO_MAPPED = """
import asyncio, torch
from rdma_tensor import Publisher, Subscriber
async def main():
    source, model, publisher = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), Publisher()
    result = await Subscriber(model).pull(publisher.publish(source.state_dict(), 1))
    print("mapped:", result.mapped, flush=True)
    with torch.no_grad():
        model.weight.add_(1.0)
    print("survived", flush=True)
asyncio.run(main())
"""


def test_a_failed_swap_puts_every_tensor_back() -> None:
    model = make_module()
    plan = [(name, t) for name, t in model.state_dict(keep_vars=True).items()]
    before = {name: t.data_ptr() for name, t in plan}
    views = {name: torch.ones(t.shape) for name, t in plan[:-1]}  # the last one is missing
    entries = [(TensorEntry(name, t.dtype, tuple(t.shape), 0, 0, 0), t) for name, t in plan]
    with pytest.raises(KeyError):
        _swap(entries, views)
    assert {name: t.data_ptr() for name, t in plan} == before
    assert not any(t.any() for _, t in plan)


async def test_bad_arguments(publisher: Publisher) -> None:
    with pytest.raises(ValueError, match="mode must be one of"):
        Subscriber(make_module(), mode="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"pass the nn\.Module itself"):
        Subscriber(make_module().state_dict(), mode="map")
    with pytest.raises(TypeError, match=r"nn\.Module or a mapping"):
        Subscriber([torch.zeros(1)])  # type: ignore[arg-type]
    manifest = publisher.publish(version_state(1), 1)
    model = make_module()
    model.extra = torch.nn.Parameter(torch.zeros(1))
    subscriber = Subscriber(model)
    with pytest.raises(MismatchError, match=r"not published: \['extra'\]"):
        await subscriber.pull(manifest)
    assert subscriber.version is None
    assert not subscriber.mapped
    assert not any(t.any() for t in model.state_dict().values())


async def test_release_is_accepted_and_changes_nothing(publisher: Publisher) -> None:
    """`Publisher.release(version)` exists for symmetry with dtensor-reshard's publisher:
    slots are reused by leases alone, so releasing neither frees nor invalidates anything."""
    first = publisher.publish(version_state(1), 1)
    publisher.release(1)
    into = {n: torch.zeros(s) for n, s in SHAPES.items()}
    assert (await pull(first, into=into)).version == 1  # still readable after release
    assert matches(into, 1)
    second = publisher.publish(version_state(2), 2)
    publisher.release(2)
    assert (await pull(second, into=into)).version == 2
    assert matches(into, 2)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="non-negative int"):
            publisher.release(bad)  # type: ignore[arg-type]
