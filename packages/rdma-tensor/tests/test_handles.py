"""`share` / `TensorHandle.read_into` between separate Monarch processes, for every transport
this machine has (shared memory and Monarch RDMA over TCP on CPU; CUDA IPC when a GPU is
present)."""

from __future__ import annotations

import pickle

import pytest
import torch
from monarch.actor import ProcMesh
from rdma_tensor import (
    MismatchError,
    PublisherClosedError,
    SharedTensor,
    Transport,
    TransportError,
    share,
)
from rdma_tensor.lowlevel import check_owner, choose_transport, local_tensor, transport_override
from sync_actors import Owner, Reader

DATA = {
    torch.float32: torch.randn(3000, generator=torch.Generator().manual_seed(0)),
    torch.bfloat16: torch.randn(3000, generator=torch.Generator().manual_seed(1)).bfloat16(),
    torch.int64: torch.randint(
        -(2**62), 2**62, (3000,), generator=torch.Generator().manual_seed(2)
    ),
}


@pytest.fixture(scope="module")
def owner(procs: ProcMesh) -> Owner:
    return procs.slice(procs=0).spawn("owner", Owner)


@pytest.fixture(scope="module")
def reader(procs: ProcMesh) -> Reader:
    return procs.slice(procs=1).spawn("reader", Reader)


@pytest.mark.parametrize("transport", [None, Transport.SHM, Transport.RDMA])
@pytest.mark.parametrize("dtype", list(DATA))
async def test_round_trip_is_bit_exact_across_processes(
    owner: Owner, reader: Reader, transport: Transport | None, dtype: torch.dtype
) -> None:
    data = DATA[dtype]
    handle = await owner.share.call_one(data, transport)
    assert (handle.numel, handle.dtype, handle.nbytes) == (3000, dtype, 3000 * dtype.itemsize)
    got, used = await reader.read.call_one(handle, torch.zeros(3000, dtype=dtype), 0, None)
    assert used is (transport or Transport.SHM)
    assert torch.equal(got, data)
    # A slice at an offset, into a 2-D destination.
    got, _ = await reader.read.call_one(handle, torch.zeros(10, 7, dtype=dtype), 1234, None)
    assert torch.equal(got, data[1234:1304].view(10, 7))
    await owner.close.call_one()


async def test_reader_may_force_rdma_on_an_auto_handle(owner: Owner, reader: Reader) -> None:
    handle = await owner.share.call_one(DATA[torch.float32], None)
    got, used = await reader.read.call_one(handle, torch.zeros(100), 50, Transport.RDMA)
    assert used is Transport.RDMA
    assert torch.equal(got, DATA[torch.float32][50:150])
    await owner.close.call_one()


async def test_non_contiguous_destination(owner: Owner, reader: Reader) -> None:
    handle = await owner.share.call_one(DATA[torch.float32][:600], None)
    got = await reader.read_transposed.call_one(handle, 20, 30)
    assert torch.equal(got, DATA[torch.float32][:600].view(20, 30))
    await owner.close.call_one()


async def test_readers_see_the_owners_later_in_place_writes(owner: Owner, reader: Reader) -> None:
    handle = await owner.share.call_one(torch.zeros(64), None)
    await owner.add.call_one(2.5)
    got, _ = await reader.read.call_one(handle, torch.zeros(64), 0, None)
    assert torch.equal(got, torch.full((64,), 2.5))
    await owner.close.call_one()


async def test_closed_handle_fails_clearly(owner: Owner, reader: Reader) -> None:
    for transport in (None, Transport.RDMA):
        handle = await owner.share.call_one(torch.ones(16), transport)
        await owner.close.call_one()
        error = await reader.read_error.call_one(handle, torch.zeros(16))
        assert error.startswith("PublisherClosedError"), error


async def test_wrong_dtype_and_range_are_rejected_before_reading(
    owner: Owner, reader: Reader
) -> None:
    handle = await owner.share.call_one(torch.ones(16), None)
    error = await reader.read_error.call_one(handle, torch.zeros(16, dtype=torch.float64))
    assert error.startswith("MismatchError: dst dtype torch.float64"), error
    error = await reader.read_error.call_one(handle, torch.zeros(17))
    assert error.startswith("MismatchError: elements [0, 17) are outside"), error
    await owner.close.call_one()


async def test_same_process_reads_and_small_pickled_handle() -> None:
    source = torch.arange(1000, dtype=torch.float32)
    with share(source) as shared:
        assert len(pickle.dumps(shared.handle)) < 2000
        dst = torch.zeros(10)
        result = await shared.handle.read_into(dst, offset=990)
        assert result.transport is Transport.SHM
        assert result.nbytes == 40
        assert torch.equal(dst, source[990:])
    with pytest.raises(PublisherClosedError):
        await shared.handle.read_into(dst)


def test_bad_tensors_cannot_be_shared() -> None:
    with pytest.raises(MismatchError, match="non-contiguous"):
        share(torch.zeros(4, 4).t())
    with pytest.raises(MismatchError, match="empty"):
        share(torch.zeros(0))
    with pytest.raises(TransportError, match="cuda_ipc can only carry CUDA"):
        share(torch.zeros(4), transport=Transport.CUDA_IPC)
    with pytest.raises(TypeError):
        share([1.0, 2.0])  # type: ignore[arg-type]


async def test_a_handle_forced_to_shm_has_no_rdma_path() -> None:
    shared = share(torch.zeros(4), transport=Transport.SHM)
    with shared, pytest.raises(TransportError, match="no RDMA buffer"):
        await shared.handle.read_into(torch.zeros(4), transport=Transport.RDMA)


def test_environment_override(monkeypatch: pytest.MonkeyPatch) -> None:
    assert transport_override() is None
    monkeypatch.setenv("RDMA_TENSOR_TRANSPORT", "rdma")
    assert transport_override() is Transport.RDMA
    assert transport_override(Transport.SHM) is Transport.SHM
    # Process-wide, so it is ignored for memory it cannot carry; explicit arguments are not.
    monkeypatch.setenv("RDMA_TENSOR_TRANSPORT", "cuda_ipc")
    assert transport_override(device="cpu") is None
    assert transport_override(device="cuda:0") is Transport.CUDA_IPC
    with share(torch.zeros(4)) as shared:
        assert shared.handle.transport is Transport.SHM
    monkeypatch.setenv("RDMA_TENSOR_TRANSPORT", "carrier-pigeon")
    with pytest.raises(ValueError, match="carrier-pigeon"):
        transport_override()
    with pytest.raises(ValueError, match="RDMA_TENSOR_TRANSPORT"):
        SharedTensor(torch.zeros(2))


def test_lowlevel_helpers_see_the_owners_memory_until_it_closes() -> None:
    data = torch.arange(6.0)
    shared = share(data)
    handle = shared.handle
    assert choose_transport(handle) is Transport.SHM
    check_owner(handle.owner)  # open: returns
    flat = local_tensor(handle)
    assert torch.equal(flat, data)
    data.add_(1)  # the owner's memory itself, not a copy
    assert torch.equal(local_tensor(handle), torch.arange(1.0, 7.0))
    shared.close()
    with pytest.raises(PublisherClosedError):
        check_owner(handle.owner)
    with pytest.raises(PublisherClosedError):
        local_tensor(handle)


def test_plumbing_is_not_in_the_top_level_api() -> None:
    import rdma_tensor  # noqa: PLC0415
    import rdma_tensor.lowlevel  # noqa: PLC0415

    plumbing = {"check_owner", "choose_transport", "local_tensor", "transport_override"}
    assert not plumbing & set(rdma_tensor.__all__)
    assert plumbing <= set(rdma_tensor.lowlevel.__all__)
    assert "Layout" not in rdma_tensor.__all__  # bucket packing is `manifest.BucketLayout`


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@cuda
async def test_cuda_ipc_round_trip(owner: Owner, reader: Reader) -> None:
    data = torch.randn(4096, generator=torch.Generator().manual_seed(3))
    handle = await owner.share.call_one(data, None, "cuda")
    assert handle.device.startswith("cuda")
    got, used = await reader.read.call_one(handle, torch.zeros(4096, device="cuda"), 0, None)
    assert used is Transport.CUDA_IPC
    assert torch.equal(got.cpu(), data)
    got, _ = await reader.read.call_one(handle, torch.zeros(100), 7, None)  # into CPU memory
    assert torch.equal(got, data[7:107])
    await owner.close.call_one()
    error = await reader.read_error.call_one(handle, torch.zeros(4096, device="cuda"))
    assert error.startswith("PublisherClosedError"), error
