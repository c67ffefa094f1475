"""Errors a service raises to its callers.

An exception raised by the endpoint's own code is NOT wrapped in one of these: the caller
gets Monarch's `ActorError` exactly as `call_one` would give it (`err.exception` is the
original exception, `str(err)` carries the remote traceback). Every class here takes a
single message so it pickles, and so survives the extra hop of a `ServiceHandle`.
"""

from __future__ import annotations


class ServiceError(Exception):
    """Base class: the service, not the endpoint's code, could not serve the call."""


class NoHealthyReplicaError(ServiceError):
    """No replica was healthy within `ServiceConfig.no_healthy_timeout_s`, or none ever can be
    again (every replica used up its restart budget)."""


class ReplicaDiedError(ServiceError):
    """The replica serving the call died while the call was in flight, and the call was not
    retried: the endpoint is non-idempotent, or the retry budget was spent."""


class ServiceOverloadedError(ServiceError):
    """Every replica is at its concurrency cap and the service's queue is full
    (`ServiceConfig.max_queued`): back-pressure, raised before anything is queued."""


class ServiceClosedError(ServiceError):
    """The service was shut down before (or while) serving the call."""


class ReplicaStartError(ServiceError):
    """A replica could not be started: its processes failed to spawn, or the actor's
    `__init__` raised (the message carries Monarch's report, remote traceback included)."""


class CallTimeoutError(ServiceError):
    """A call went unanswered on its replica for longer than its timeout
    (`ServiceConfig.call_timeout_s` or `endpoint_timeouts`). The replica was taken as hung
    and restarted; the call was not re-sent because the endpoint is non-idempotent (it may
    or may not have run), or because its `max_retries` re-sends were spent."""
