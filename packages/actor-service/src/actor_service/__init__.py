"""Load-balanced, fault-tolerant replica services on Monarch.

    svc = await spawn_service(Generator, ServiceConfig(replicas=2), model_path)
    svc = await spawn_service(                         # on given hosts, hangs detected
        Generator, ServiceConfig(replicas=4, call_timeout_s=60.0), model_path,
        hosts=[host_mesh_a, host_mesh_b])
    text = await svc.generate.route(prompt)            # one healthy replica
    await svc.update_weights.fanout(version)           # every healthy replica
    async with svc.session() as s:                     # the same replica, turn after turn
        await s.generate.route(turn)
    svc.add_listener(print)                            # replica died / up / gave_up
    FaultFilter("a kill of mine", expected).install()  # drop failures you expect
    print(svc.status())
    await svc.shutdown()

See the package README for the failure semantics.
"""

from actor_service._faults import FaultFilter
from actor_service.config import ServiceConfig
from actor_service.endpoint import ServiceEndpoint, Session, non_idempotent
from actor_service.errors import (
    CallTimeoutError,
    NoHealthyReplicaError,
    ReplicaDiedError,
    ReplicaStartError,
    ServiceClosedError,
    ServiceError,
    ServiceOverloadedError,
)
from actor_service.events import ReplicaEvent
from actor_service.handle import ServiceHandle
from actor_service.metrics import ReplicaStatus, ServiceStatus
from actor_service.routers import LeastLoaded, ReplicaView, RoundRobin, Router, Sticky
from actor_service.service import Service, spawn_service

__version__ = "0.1.0"

__all__ = [
    "CallTimeoutError",
    "FaultFilter",
    "LeastLoaded",
    "NoHealthyReplicaError",
    "ReplicaDiedError",
    "ReplicaEvent",
    "ReplicaStartError",
    "ReplicaStatus",
    "ReplicaView",
    "RoundRobin",
    "Router",
    "Service",
    "ServiceClosedError",
    "ServiceConfig",
    "ServiceEndpoint",
    "ServiceError",
    "ServiceHandle",
    "ServiceOverloadedError",
    "ServiceStatus",
    "Session",
    "Sticky",
    "non_idempotent",
    "spawn_service",
]
