"""Versioned, non-blocking weight sync between Monarch actors.

Control plane: a small picklable handle or manifest travels in an actor message. Data plane:
the bytes move directly between processes (shared memory or CUDA IPC on one machine, Monarch
RDMA across machines).

    manifest = Publisher().publish(model.state_dict(), version=1)   # trainer: one copy, returns
    await Subscriber(model).pull(manifest)          # generator: atomic; same host: maps in place
    await pull(manifest, into=model.state_dict())   # or one stateless copy

    shared = share(tensor)                          # raw handles: owner
    await shared.handle.read_into(dst)              # any reader

The parts of a manifest (`BucketLayout`, `TensorEntry`, `SlotRef`) live in
`rdma_tensor.manifest`; the building blocks for libraries that plan their own reads on
handles (`check_owner`, `choose_transport`, `local_tensor`, `transport_override`) in
`rdma_tensor.lowlevel`. Which pairs of processes count as one machine (shared memory) and
which as two (RDMA), and how a process declares a machine of its own
(`RDMA_TENSOR_MACHINE_ID`), is `rdma_tensor.machine`.
"""

from rdma_tensor.actors import WeightPublisher, WeightSubscriber
from rdma_tensor.errors import (
    MismatchError,
    PublisherClosedError,
    PublisherDiedError,
    PullTimeoutError,
    RdmaTensorError,
    SlotsBusyError,
    StaleVersionError,
    TransportError,
)
from rdma_tensor.handle import ReadResult, SharedTensor, TensorHandle, share
from rdma_tensor.manifest import Manifest
from rdma_tensor.publish import Publisher, PublisherConfig
from rdma_tensor.pull import pull
from rdma_tensor.subscriber import PullResult, Subscriber, SyncMode
from rdma_tensor.transport import Transport

__version__ = "0.1.0"

__all__ = [
    "Manifest",
    "MismatchError",
    "Publisher",
    "PublisherClosedError",
    "PublisherConfig",
    "PublisherDiedError",
    "PullResult",
    "PullTimeoutError",
    "RdmaTensorError",
    "ReadResult",
    "SharedTensor",
    "SlotsBusyError",
    "StaleVersionError",
    "Subscriber",
    "SyncMode",
    "TensorHandle",
    "Transport",
    "TransportError",
    "WeightPublisher",
    "WeightSubscriber",
    "pull",
    "share",
]
