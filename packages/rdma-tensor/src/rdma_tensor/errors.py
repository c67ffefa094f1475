"""Every error this package raises, so callers can catch one family or one cause.

All of them derive from `RdmaTensorError`. Errors about the caller's input also derive from
`ValueError`, timeouts from `TimeoutError`. Each is raised before any destination tensor is
touched, unless its docstring says otherwise.
"""

from __future__ import annotations


class RdmaTensorError(Exception):
    """Base class of every error raised by rdma-tensor."""


class MismatchError(RdmaTensorError, ValueError):
    """Names, shapes, dtypes, sizes or layout of the caller's tensors do not fit."""


class StaleVersionError(RdmaTensorError, ValueError):
    """A version older than (or equal to) one already published or applied."""


class TransportError(RdmaTensorError):
    """No transport can carry these bytes between this pair of processes."""


class PublisherClosedError(RdmaTensorError):
    """The owner closed the shared memory (`SharedTensor.close` / `Publisher.close`)."""


class PublisherDiedError(RdmaTensorError):
    """The process that owns the shared memory is gone (killed, crashed or exited)."""


class PullTimeoutError(RdmaTensorError, TimeoutError):
    """The wanted version did not become readable within the timeout."""


class SlotsBusyError(RdmaTensorError):
    """Every staging slot stayed leased by readers for the whole publish timeout."""
