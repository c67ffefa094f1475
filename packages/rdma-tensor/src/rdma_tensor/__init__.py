"""Versioned, non-blocking weight sync between Monarch actors.

Control plane: a small picklable handle or manifest travels in an actor message. Data plane:
the bytes move directly between processes (shared memory or CUDA IPC on one machine, Monarch
RDMA across machines).

    shared = share(tensor)                         # owner
    await shared.handle.read_into(dst)             # any reader

    manifest = Publisher().publish(state_dict, version=1)        # trainer: one copy, returns
    await pull(manifest, into=model.state_dict())                # generator: atomic, in place
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
from rdma_tensor.manifest import Layout, Manifest, SlotRef, TensorEntry
from rdma_tensor.publish import Publisher, PublisherConfig
from rdma_tensor.pull import PullResult, pull
from rdma_tensor.transport import ENV_VAR, Transport

__version__ = "0.1.0"

__all__ = [
    "ENV_VAR",
    "Layout",
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
    "SlotRef",
    "SlotsBusyError",
    "StaleVersionError",
    "TensorEntry",
    "TensorHandle",
    "Transport",
    "TransportError",
    "WeightPublisher",
    "WeightSubscriber",
    "pull",
    "share",
]
