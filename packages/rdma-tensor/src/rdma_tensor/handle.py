"""Tensor handles: a small picklable description of a tensor that any process can read.

`share(tensor)` runs in the process that owns the tensor and returns a `SharedTensor`, which
keeps the memory alive and exposes `.handle`. The handle travels in an actor message; the
receiver calls `await handle.read_into(dst)` and the bytes move process to process without
passing through any actor message.
"""

from __future__ import annotations

import time
import uuid
import weakref
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING

import torch

from rdma_tensor import _cuda_ipc, _rdma, _shm
from rdma_tensor._cuda_ipc import CudaIpcRef
from rdma_tensor._owner import Control, Owner, OwnerState, is_local, is_this_process, owner_state
from rdma_tensor._shm import ShmRegion
from rdma_tensor.errors import (
    MismatchError,
    PublisherClosedError,
    PublisherDiedError,
    TransportError,
)
from rdma_tensor.machine import this_machine
from rdma_tensor.transport import Transport, transport_override

if TYPE_CHECKING:
    from monarch.rdma import RDMABuffer

# Tensors shared by this process, for readers in the same process (a process cannot open its
# own CUDA IPC handle). Weak: the owner's objects decide the lifetime.
_local_tensors: weakref.WeakValueDictionary[str, torch.Tensor] = weakref.WeakValueDictionary()


@dataclass(frozen=True)
class ReadResult:
    """What one `read_into` moved: `nbytes` bytes over `transport` in `seconds` (wall)."""

    transport: Transport
    nbytes: int
    seconds: float


@dataclass(frozen=True)
class TensorHandle:
    """A picklable reference to a contiguous tensor owned by another (or this) process.

    It describes the tensor as a flat 1-D array of `numel` elements of `dtype`. It holds
    the means for each transport the owner enabled: a shared-memory region (CPU tensors),
    a CUDA IPC handle (CUDA tensors) and a Monarch `RDMABuffer` (any machine).
    """

    dtype: torch.dtype
    numel: int
    device: str
    owner: Owner
    uid: str
    forced: Transport | None = None
    shm: ShmRegion | None = None
    cuda_ipc: CudaIpcRef | None = field(default=None, repr=False)
    rdma: RDMABuffer | None = field(default=None, repr=False)
    rdma_unavailable: str = ""

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    @property
    def transport(self) -> Transport:
        """The transport a read from *this* process would use."""
        return choose_transport(self)

    async def read_into(
        self,
        dst: torch.Tensor,
        *,
        offset: int = 0,
        timeout: float = 60.0,  # noqa: ASYNC109 - bounds the RDMA transfer (agreed API)
        transport: Transport | None = None,
    ) -> ReadResult:
        """Copies elements `[offset, offset + dst.numel())` of the flat tensor into `dst`.

        `dst` may be non-contiguous and on CPU or CUDA, but must have the handle's dtype.
        `timeout` (seconds) bounds RDMA transfers; same-machine copies are plain memory copies
        that cannot block. `transport` forces one (see `choose_transport`). Raises
        `MismatchError` for a wrong dtype or range, `PublisherClosedError` /
        `PublisherDiedError` when the owner closed the handle or died, and `TransportError`
        when nothing can carry the bytes between this pair of processes. On error, `dst` is
        unchanged unless the RDMA transfer itself failed part-way.
        """
        n = _check_read(self, dst, offset)
        chosen = choose_transport(self, transport)
        start = time.perf_counter()
        if is_local(self.owner.process):
            try:
                check_owner(self.owner)
            except (PublisherClosedError, PublisherDiedError):
                forget_owner(self.owner)
                raise
        if chosen is Transport.RDMA:
            await _read_rdma(self, dst, offset, timeout)
        else:
            src = local_tensor(self, chosen)
            with torch.no_grad():
                dst.copy_(src[offset : offset + n].view(dst.shape))
            if src.is_cuda or dst.is_cuda:
                torch.cuda.synchronize(src.device if src.is_cuda else dst.device)
        return ReadResult(chosen, n * self.dtype.itemsize, time.perf_counter() - start)


def choose_transport(handle: TensorHandle, requested: Transport | None = None) -> Transport:
    """The transport for reading `handle` here: `requested`, else the owner's forced one,
    else this process's `RDMA_TENSOR_TRANSPORT`, else the best one available (`SHM` or
    `CUDA_IPC` on the owner's machine, `RDMA` elsewhere; `rdma_tensor.machine.same_machine`
    of the owner's `Machine` and this process's decides which).

    Raises `TransportError` when the requested or forced transport cannot reach the owner's
    memory from here, or when nothing can.
    """
    forced = requested or handle.forced or transport_override(device=handle.device)
    local = is_local(handle.owner.process)
    if forced is not None:
        _check_possible(handle, forced, local)
        return forced
    if local and handle.shm is not None:
        return Transport.SHM
    if local and handle.cuda_ipc is not None:
        return Transport.CUDA_IPC
    if handle.rdma is not None:
        return Transport.RDMA
    raise TransportError(
        f"tensor owned by pid {handle.owner.process.pid} on {handle.owner.process.machine} is "
        f"not on this machine ({this_machine()}) and has no RDMA buffer "
        f"({handle.rdma_unavailable or 'not registered'})"
    )


def _check_possible(handle: TensorHandle, transport: Transport, local: bool) -> None:
    owner = handle.owner.process
    if transport is Transport.RDMA:
        if handle.rdma is None:
            raise TransportError(
                f"RDMA requested but the owner registered no RDMA buffer "
                f"({handle.rdma_unavailable or 'it forced another transport'})"
            )
        return
    what = {Transport.SHM: handle.shm, Transport.CUDA_IPC: handle.cuda_ipc}[transport]
    if what is None:
        raise TransportError(
            f"{transport.value} requested for a {handle.device} tensor whose owner did not "
            f"export it that way (forced={handle.forced})"
        )
    if not local:
        raise TransportError(
            f"{transport.value} needs the owner's machine: owner is on {owner.machine}, "
            f"this process on {this_machine()} (see rdma_tensor.machine)"
        )
    if transport is Transport.CUDA_IPC and not torch.cuda.is_available():
        raise TransportError("cuda_ipc requested but CUDA is not available in this process")


def _check_read(handle: TensorHandle, dst: torch.Tensor, offset: int) -> int:
    if not isinstance(dst, torch.Tensor):
        raise TypeError(f"dst must be a torch.Tensor, got {type(dst).__name__}")
    if dst.dtype != handle.dtype:
        raise MismatchError(
            f"dst dtype {dst.dtype} differs from the shared tensor's {handle.dtype}; "
            "read into a tensor of the same dtype and cast afterwards"
        )
    if dst.device.type not in ("cpu", "cuda"):
        raise MismatchError(f"dst must be on cpu or cuda, not {dst.device}")
    n = dst.numel()
    if offset < 0 or offset + n > handle.numel:
        raise MismatchError(
            f"elements [{offset}, {offset + n}) are outside the shared tensor's "
            f"{handle.numel} elements"
        )
    return n


def check_owner(owner: Owner) -> None:
    """Raises `PublisherClosedError` / `PublisherDiedError` if the owner (on this machine)
    closed the memory or died; returns if it is open. Costs a `stat` of `/proc/<pid>/fd/<n>`
    (microseconds). Only meaningful on the owner's machine: the owner of `handle` is
    `handle.owner`, and `choose_transport(handle)` is not `RDMA` there.

    Callers let go of the owner's memory afterwards with `forget_owner`, once they no longer
    use it (a pull may still need it to restore the previous version).
    """
    state = owner_state(owner)
    if state is OwnerState.OPEN:
        return
    pid = owner.process.pid
    if state is OwnerState.CLOSED:
        raise PublisherClosedError(f"the owner (pid {pid}) closed this shared memory")
    raise PublisherDiedError(f"the owner process (pid {pid}) died")


def forget_owner(owner: Owner) -> None:
    """Drops this process's mappings and opened handles of `owner`'s memory."""
    _shm.forget(owner.process)
    _cuda_ipc.forget(owner.process)


def local_tensor(handle: TensorHandle, transport: Transport | None = None) -> torch.Tensor:
    """The shared tensor itself, as a flat 1-D tensor of this process: no copy.

    For readers on the owner's machine: shared memory is mapped read-only (writing through
    the result kills the process with SIGSEGV), CUDA memory is opened by CUDA IPC, and in the
    owner's own process it is the original tensor. The owner may change the memory later
    (publish/pull order that; users of raw handles order it themselves). Mappings are cached
    per owner until it closes or dies. `transport` defaults to `choose_transport(handle)`.

    Raises `TransportError` when the reader is not on the owner's machine (or `transport`
    is `RDMA`: use `read_into`), and `PublisherClosedError` / `PublisherDiedError` when the
    owner closed the memory or died.
    """
    chosen = choose_transport(handle, transport)
    if chosen is Transport.RDMA:
        raise TransportError(
            "local_tensor maps the owner's memory, which needs shm or cuda_ipc; this handle "
            "is read over rdma here: use read_into"
        )
    check_owner(handle.owner)
    if is_this_process(handle.owner.process):
        tensor = _local_tensors.get(handle.uid)
        if tensor is not None:
            return tensor.detach().reshape(-1)
    if chosen is Transport.SHM:
        assert handle.shm is not None
        view, _ = _shm.local_view(handle.owner.process, handle.shm)
        return view.view(handle.dtype)
    if is_this_process(handle.owner.process):
        raise PublisherClosedError("the shared CUDA tensor is no longer alive in this process")
    assert handle.cuda_ipc is not None
    return _cuda_ipc.open_cuda(handle.owner.process, handle.owner.control, handle.cuda_ipc)


async def _read_rdma(
    handle: TensorHandle, dst: torch.Tensor, offset: int, timeout_s: float
) -> None:
    assert handle.rdma is not None
    whole = offset == 0 and dst.numel() == handle.numel
    if whole and dst.is_contiguous() and dst.device.type == "cpu":
        await _rdma.read(handle.rdma, dst, timeout_s)
        return
    # RDMABuffer reads whole buffers only: bounce through a local copy of all of it.
    bounce = torch.empty(handle.numel, dtype=handle.dtype)
    await _rdma.read(handle.rdma, bounce, timeout_s)
    with torch.no_grad():
        dst.copy_(bounce[offset : offset + dst.numel()].view(dst.shape))


def make_handle(
    tensor: torch.Tensor, owner: Owner, forced: Transport | None
) -> tuple[TensorHandle, RDMABuffer | None]:
    """Exports a contiguous CPU/CUDA tensor for every transport `forced` allows.

    A CPU tensor's storage moves into shared memory in place (see `_shm.export_cpu`). Returns
    the handle and the RDMA buffer to drop when done (None when not registered).
    """
    device = tensor.device.type
    if forced is Transport.CUDA_IPC and device != "cuda":
        raise TransportError("cuda_ipc can only carry CUDA tensors; this one is on cpu")
    if forced is Transport.SHM and device != "cpu":
        raise TransportError(f"shm can only carry CPU tensors; this one is on {tensor.device}")
    shm = cuda_ipc = None
    if forced is not Transport.RDMA:
        if device == "cpu":
            shm = _shm.export_cpu(tensor)
        else:
            cuda_ipc = _cuda_ipc.export_cuda(tensor)
    rdma: RDMABuffer | None = None
    unavailable = ""
    if forced in (None, Transport.RDMA):
        try:
            rdma = _rdma.register(tensor, quiet=forced is None)
        except Exception as e:
            if forced is Transport.RDMA:
                raise TransportError(f"RDMA forced but registration failed: {e}") from e
            unavailable = f"registration failed: {e}"
    else:
        unavailable = f"owner forced {forced.value}"
    handle = TensorHandle(
        dtype=tensor.dtype,
        numel=tensor.numel(),
        device=str(tensor.device),
        owner=owner,
        uid=uuid.uuid4().hex,
        forced=forced,
        shm=shm,
        cuda_ipc=cuda_ipc,
        rdma=rdma,
        rdma_unavailable=unavailable,
    )
    _local_tensors[handle.uid] = tensor
    return handle, rdma


class SharedTensor:
    """The owner's side of a shared tensor: keeps the memory alive until `close()`.

    `tensor` is the memory readers see; for a CPU tensor it is the caller's tensor, whose
    storage `share` moved into shared memory in place, so later in-place writes are visible
    to later reads. Writes racing a read are the caller's to order (publish/pull does that).
    """

    def __init__(self, tensor: torch.Tensor, transport: Transport | None = None) -> None:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"share() needs a torch.Tensor, got {type(tensor).__name__}")
        forced = transport_override(transport, device=str(tensor.device))
        if tensor.device.type not in ("cpu", "cuda"):
            raise MismatchError(f"only cpu and cuda tensors can be shared, not {tensor.device}")
        if not tensor.is_contiguous():
            raise MismatchError(
                f"cannot share a non-contiguous tensor (shape {tuple(tensor.shape)}, stride "
                f"{tensor.stride()}): readers see a flat view; pass tensor.contiguous()"
            )
        if tensor.numel() == 0:
            raise MismatchError("cannot share an empty tensor")
        self._control = Control()
        self._tensor: torch.Tensor | None = tensor
        self._handle, self._rdma = make_handle(tensor, self._control.owner, forced)

    @property
    def handle(self) -> TensorHandle:
        return self._handle

    @property
    def tensor(self) -> torch.Tensor:
        if self._tensor is None:
            raise PublisherClosedError("this SharedTensor is closed")
        return self._tensor

    @property
    def closed(self) -> bool:
        return self._tensor is None

    def close(self) -> None:
        """Readers fail from now on; the memory is freed once no one else references it."""
        if self._rdma is not None:
            _rdma.drop(self._rdma)
            self._rdma = None
        self._control.close()
        self._tensor = None

    def __enter__(self) -> SharedTensor:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def share(tensor: torch.Tensor, *, transport: Transport | None = None) -> SharedTensor:
    """Shares a contiguous CPU or CUDA tensor; send `.handle` to readers.

    Call it in the process that owns the tensor (a Monarch actor or the controller). The
    transport is forced by `transport`, else by `RDMA_TENSOR_TRANSPORT`, else chosen by each
    reader (shared memory or CUDA IPC on the same machine, RDMA across machines).
    """
    return SharedTensor(tensor, transport)
