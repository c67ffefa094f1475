"""`ServiceConfig`: how many replicas, how they are loaded, and how failures are handled."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from actor_service.routers import Router, Sticky


def _default_router() -> Router:
    return Sticky()


def _is_seconds(value: object) -> bool:
    """A finite number > 0 (a bool is not a number of seconds)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


@dataclass(frozen=True)
class ServiceConfig:
    """Configuration of one service. Every field is checked on construction; a bad value
    raises `ValueError` naming the field.

    Sizes:
        replicas: number of replicas, each its own process mesh.
        procs_per_replica: processes in each replica's mesh. Every call is sent to all of
            them (SPMD) and `route` returns rank 0's result.
        with_gpus: pin GPUs to every process: process `r` of the replica in GPU block `b`
            of its host (the first replica placed on a host has block 0, the next 1, ...)
            sees only the `gpus_per_proc` GPUs from `first_gpu + (b * procs_per_replica +
            r) * gpus_per_proc` on (through CUDA_VISIBLE_DEVICES, set before the actor
            starts; indices count the GPUs the service's own process sees), on the same GPUs
            again after a restart.
        gpus_per_proc: with `with_gpus`, the GPUs each process sees (a tensor-parallel
            engine that starts its own workers needs several in one process).
        first_gpu: with `with_gpus`, the first GPU of every host the service uses (the
            ones before it are left to something else, a trainer say).

    Load:
        max_in_flight_per_replica: requests sent to one replica at once. Monarch runs a
            plain endpoint one message at a time, so 2 (one running, one waiting in the
            mailbox) keeps a replica busy; raise it for `@concurrent_endpoint` actors. The
            rest wait in the controller, where a replica's death cannot lose them.
        max_queued: requests waiting for a slot, service-wide. When that many wait, `route`
            raises `ServiceOverloadedError` instead of queueing more (back-pressure).
        router: picks a replica per request. The service works on a copy, so one config
            can serve several services. Sessions need a router with `supports_sessions`.

    Failures:
        max_retries: how many times an idempotent request that was in flight on a replica
            that died is sent again (to another healthy replica). 0 turns retries off.
        non_idempotent: endpoint names that are never re-sent after being in flight on a
            replica that died; the caller gets `ReplicaDiedError` instead. (The
            `@non_idempotent` decorator on the actor declares the same thing.)
        call_timeout_s: seconds a call may go unanswered on a replica before the replica is
            taken as hung: its processes are stopped and it is restarted as after a death,
            and the call is re-sent elsewhere (idempotent endpoints, within `max_retries`)
            or fails with `CallTimeoutError`. None (the default): no timeout. A call's
            clock starts when it is sent, or when the calls sent to that replica before it
            are all answered (the replica runs a plain endpoint one call at a time, so time
            spent waiting behind other calls is not counted).
        endpoint_timeouts: per-endpoint timeouts that replace `call_timeout_s` for the
            endpoints they name, as (endpoint name, seconds) pairs, e.g.
            `(("generate", 120.0), ("ping", 5.0))`; a name that is not an endpoint of the
            actor is an error at `spawn_service`.
        max_restarts: restarts per replica over the service's life; after that the replica
            stays down and the service serves with the others.
        restart_backoff_s: delay before a replica's first restart; doubles with each restart
            of that replica, up to `restart_backoff_max_s`.
        no_healthy_timeout_s: how long a call waits for a healthy replica before raising
            `NoHealthyReplicaError` (it raises at once if no replica can come back).
        start_timeout_s: how long one replica may take to spawn and run `__init__`, in
            all (every host a restart tries included).
        spawn_timeout_s: how long spawning one replica's processes on one host may take.
            A host that gives no answer by then is marked down, and a restart goes on at
            once with the next host. Monarch gives up on a host that is gone only after its
            `mesh_proc_spawn_max_idle` (30 s by default, and reset by any sign of progress),
            so this is what bounds the time a dead host costs a restart.
        stop_timeout_s: how long stopping one replica's processes may take (after a death
            or a hang, and at shutdown). Past it the service stops waiting and logs a
            warning naming the replica: a host that is gone never answers a stop.
        drain_timeout_s: at `shutdown()`, how long accepted calls get to finish.

    name: names the service in errors, `status()` and Monarch's actor names.
    """

    replicas: int = 1
    procs_per_replica: int = 1
    with_gpus: bool = False
    gpus_per_proc: int = 1
    first_gpu: int = 0
    max_in_flight_per_replica: int = 2
    max_queued: int = 10_000
    router: Router = field(default_factory=_default_router)
    max_retries: int = 2
    non_idempotent: tuple[str, ...] = ()
    call_timeout_s: float | None = None
    endpoint_timeouts: tuple[tuple[str, float], ...] = ()
    max_restarts: int = 3
    restart_backoff_s: float = 0.5
    restart_backoff_max_s: float = 30.0
    no_healthy_timeout_s: float = 30.0
    start_timeout_s: float = 300.0
    spawn_timeout_s: float = 30.0
    stop_timeout_s: float = 30.0
    drain_timeout_s: float = 10.0
    name: str = "service"

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, rule: str) -> None:
            if not ok:
                raise ValueError(
                    f"ServiceConfig.{name} must be {rule}, got {getattr(self, name)!r}"
                )

        for name in ("replicas", "procs_per_replica", "gpus_per_proc", "max_in_flight_per_replica"):
            value = getattr(self, name)
            need(isinstance(value, int) and value >= 1, name, "an int >= 1")
        for name in ("max_queued", "max_retries", "max_restarts", "first_gpu"):
            value = getattr(self, name)
            need(isinstance(value, int) and value >= 0, name, "an int >= 0")
        for name in (
            "restart_backoff_s",
            "restart_backoff_max_s",
            "no_healthy_timeout_s",
            "start_timeout_s",
            "spawn_timeout_s",
            "stop_timeout_s",
            "drain_timeout_s",
        ):
            value = getattr(self, name)
            ok = isinstance(value, int | float) and math.isfinite(value) and value > 0
            need(ok, name, "a finite number > 0 (seconds)")
        need(
            self.restart_backoff_max_s >= self.restart_backoff_s,
            "restart_backoff_max_s",
            f">= restart_backoff_s ({self.restart_backoff_s})",
        )
        need(isinstance(self.router, Router), "router", "a Router (an object with pick)")
        names: object = self.non_idempotent
        need(
            isinstance(names, tuple) and all(isinstance(n, str) for n in names),
            "non_idempotent",
            "a tuple of endpoint names",
        )
        need(
            self.call_timeout_s is None or _is_seconds(self.call_timeout_s),
            "call_timeout_s",
            "None or a finite number > 0 (seconds)",
        )
        pairs: object = self.endpoint_timeouts
        need(
            isinstance(pairs, tuple)
            and all(
                isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) and _is_seconds(p[1])
                for p in pairs
            ),
            "endpoint_timeouts",
            "a tuple of (endpoint name, finite number > 0 of seconds) pairs",
        )
        names_timed = [name for name, _ in self.endpoint_timeouts]
        need(
            len(set(names_timed)) == len(names_timed),
            "endpoint_timeouts",
            "pairs naming each endpoint once",
        )
        need(self.name.isidentifier(), "name", "a Python identifier")

    def timeout_for(self, endpoint: str) -> float | None:
        """Seconds a call to `endpoint` may go unanswered on a replica; None: no limit."""
        for name, seconds in self.endpoint_timeouts:
            if name == endpoint:
                return float(seconds)
        return None if self.call_timeout_s is None else float(self.call_timeout_s)

    def restart_delay(self, restarts: int) -> float:
        """Seconds to wait before restarting a replica that was restarted `restarts` times
        already: `restart_backoff_s`, doubled per earlier restart, capped."""
        return float(min(self.restart_backoff_s * 2**restarts, self.restart_backoff_max_s))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ServiceConfig:
        """Builds a config from plain values (e.g. a parsed TOML table); an unknown key is an
        error that lists the known ones. `non_idempotent` may be given as a list, and
        `endpoint_timeouts` as a table (`{"generate": 120.0}`) or a list of pairs."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown ServiceConfig keys {unknown}; known: {sorted(known)}")
        kwargs = dict(values)
        if isinstance(kwargs.get("non_idempotent"), list):
            kwargs["non_idempotent"] = tuple(kwargs["non_idempotent"])
        timeouts = kwargs.get("endpoint_timeouts")
        if isinstance(timeouts, Mapping):
            kwargs["endpoint_timeouts"] = tuple(timeouts.items())
        elif isinstance(timeouts, list):
            kwargs["endpoint_timeouts"] = tuple(
                tuple(p) if isinstance(p, list) else p for p in timeouts
            )
        return cls(**kwargs)
