"""The actor that owns every replica's process mesh, so that it receives their failures.

Monarch reports a failure to the owner of the failed mesh, and a failure no owner handles
exits the controller. Spawning the replica meshes from this actor (which runs inside the
service's own process) makes it their owner: its `__supervise__` handles every failure and
forwards a `DeathNotice` to the service through a port. Calls do not pass through it; the
service calls the replica meshes directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from dataclasses import dataclass
from typing import Any

from monarch.actor import (
    Actor,
    MeshFailure,
    Port,
    ProcMesh,
    current_rank,
    endpoint,
    this_host,
)
from monarch.actor.concurrent import concurrent_endpoint

from actor_service._deadline import within


@dataclass(frozen=True)
class DeathNotice:
    """Replica `index`, started as `generation`, failed; `report` is Monarch's account."""

    index: int
    generation: int
    report: str


@dataclass(frozen=True)
class ProcSpec:
    """The processes of generation `generation` of replica `index`: `procs` of them on
    `host` (a single-host `HostMesh`, or None for this host), spawned within `timeout_s`
    seconds. With `with_gpus`, process `r` sees only the `gpus_per_proc` GPUs from
    `first_gpu + r * gpus_per_proc` on. Its meshes are named after `prefix`."""

    prefix: str
    index: int
    generation: int
    host: Any
    procs: int
    with_gpus: bool
    first_gpu: int
    timeout_s: float
    gpus_per_proc: int = 1


@dataclass(frozen=True)
class ActorSpec:
    """The actor of generation `generation` of replica `index`, `actor_cls(*args,
    **kwargs)`, spawned on the processes its `ProcSpec` started."""

    prefix: str
    index: int
    generation: int
    actor_cls: type[Actor]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class SpawnedReplica:
    """A spawned replica: the user's actor mesh and the pid of each of its processes."""

    mesh: Any
    pids: tuple[int, ...]


class ReplicaAgent(Actor):
    """Runs beside the user's actor in every replica process, to report its pid."""

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


def pin_gpu(first_gpu: int, gpus_per_proc: int = 1) -> None:
    """Bootstrap of a replica process: it sees `gpus_per_proc` GPUs from `first_gpu` + its
    rank times `gpus_per_proc` on, counted among the GPUs its parent saw (an inherited
    CUDA_VISIBLE_DEVICES is a list to pick from, not physical indices)."""
    start = first_gpu + current_rank().rank * gpus_per_proc
    picked = range(start, start + gpus_per_proc)
    inherited = os.environ.get("CUDA_VISIBLE_DEVICES")
    if inherited:
        listed = [d.strip() for d in inherited.split(",") if d.strip()]
        # Past the list: an index no device has, so CUDA sees none rather than a wrong one.
        chosen = [listed[i] if i < len(listed) else "-1" for i in picked]
    else:
        chosen = [str(i) for i in picked]
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(chosen)


class ReplicaSupervisor(Actor):
    """Spawns and stops replica meshes; reports their deaths to `notices`. Every stop
    gives up after `stop_timeout_s`."""

    def __init__(self, notices: Port[DeathNotice], stop_timeout_s: float) -> None:
        self._notices = notices
        self._stop_timeout_s = stop_timeout_s
        self._procs: dict[tuple[int, int], ProcMesh] = {}
        self._owners: dict[str, tuple[int, int]] = {}
        self._abandoned: set[asyncio.Task[None]] = set()  # stops of spawns given up on

    # Concurrent, so that replicas start in parallel and a slow stop never delays a restart.
    # Two steps, so that the service can tell a host that cannot spawn processes (it is
    # gone) from an actor whose `__init__` fails.
    @concurrent_endpoint
    async def spawn_procs(self, spec: ProcSpec) -> None:
        """Starts the processes; raises if the host cannot, and `TimeoutError` if it gives
        no answer within `spec.timeout_s`. (Monarch alone waits its
        `mesh_proc_spawn_max_idle`, 30 s by default, on a host that is gone.)"""
        dim = "gpus" if spec.with_gpus else "procs"
        bootstrap = (
            functools.partial(pin_gpu, spec.first_gpu, spec.gpus_per_proc)
            if spec.with_gpus
            else None
        )
        host = spec.host if spec.host is not None else this_host()
        proc_mesh = host.spawn_procs(
            per_host={dim: spec.procs}, bootstrap=bootstrap, name=f"{spec.prefix}r{spec.index}"
        )
        key = (spec.index, spec.generation)
        self._procs[key] = proc_mesh
        try:
            await within(
                spec.timeout_s,
                f"spawning {spec.procs} process(es)",
                proc_mesh.initialized,
                "spawn_timeout_s",
            )
        except TimeoutError:
            self._forget(key, proc_mesh)
            # A host that is slow rather than gone may still start them later: stop them
            # then, so that no process outlives the attempt that gave up on it.
            task = asyncio.get_running_loop().create_task(self._stop_quietly(proc_mesh))
            self._abandoned.add(task)
            task.add_done_callback(self._abandoned.discard)
            raise
        except BaseException:
            # Nothing runs there to stop, and stopping a mesh on a dead host waits long.
            self._forget(key, proc_mesh)
            raise

    def _forget(self, key: tuple[int, int], proc_mesh: ProcMesh) -> None:
        if self._procs.get(key) is proc_mesh:
            del self._procs[key]

    async def _stop_quietly(self, proc_mesh: ProcMesh) -> None:
        # Expected to fail on a host that is gone: there is nothing left to stop there.
        with contextlib.suppress(Exception):
            await self._bounded_stop(proc_mesh, "processes whose spawn was given up on")

    @concurrent_endpoint
    async def spawn_actor(self, spec: ActorSpec) -> SpawnedReplica:
        """Spawns the user's actor (and the pid agent) on the processes of `spec`'s
        replica generation, started by `spawn_procs`."""
        key = (spec.index, spec.generation)
        proc_mesh = self._procs[key]
        tag = f"r{spec.index}g{spec.generation}"
        # The agent first, and answered, before the user's actor: each actor unpickles
        # its class (importing its module) on its own thread, and a user's module that
        # imports actor_service, imported beside the agent's actor_service._supervisor,
        # can trip CPython's import-deadlock check (seen in CI: `_DeadlockError` on
        # `_ModuleLock('actor_service._supervisor')`). One import at a time cannot.
        agent: Any = proc_mesh.spawn(f"{spec.prefix}agent_{tag}", ReplicaAgent)
        self._owners[await agent._name] = key
        pids = await agent.pid.call()
        mesh: Any = proc_mesh.spawn(
            f"{spec.prefix}{tag}", spec.actor_cls, *spec.args, **spec.kwargs
        )
        self._owners[await mesh._name] = key
        return SpawnedReplica(mesh, tuple(pid for _, pid in pids.items()))

    @concurrent_endpoint
    async def stop_replica(self, index: int, generation: int) -> None:
        """Stops that generation's processes; `TimeoutError` after `stop_timeout_s`."""
        await self._stop((index, generation))

    @concurrent_endpoint
    async def stop_all(self) -> list[str]:
        """Stops every replica's processes, and waits for the stops of spawns given up on;
        returns one line per stop that failed or gave no answer within `stop_timeout_s`."""
        keys = list(self._procs)
        # The abandoned stops come last and never raise, so `zip` pairs keys and results.
        results = await asyncio.gather(
            *(self._stop(key) for key in keys), *self._abandoned, return_exceptions=True
        )
        return [
            str(result) or f"stopping replica {key[0]} (generation {key[1]}): {result!r}"
            for key, result in zip(keys, results, strict=False)
            if isinstance(result, BaseException)
        ]

    async def _stop(self, key: tuple[int, int]) -> None:
        proc_mesh = self._procs.pop(key, None)
        for name in [n for n, owner in self._owners.items() if owner == key]:
            del self._owners[name]
        if proc_mesh is not None:
            await self._bounded_stop(
                proc_mesh, f"the processes of replica {key[0]} (generation {key[1]})"
            )

    async def _bounded_stop(self, proc_mesh: ProcMesh, what: str) -> None:
        # Monarch's stop of a mesh on a host that is gone waits for that host's answer,
        # which never comes (with its default 10 s supervision poll; 60 s with a 1 s poll).
        await within(self._stop_timeout_s, f"stopping {what}", proc_mesh.stop(), "stop_timeout_s")

    def __supervise__(self, failure: MeshFailure) -> bool:
        owner = self._owners.get(failure.mesh_name)
        if owner is not None:
            # If the service is already gone there is nobody left to tell.
            with contextlib.suppress(Exception):
                self._notices.send(DeathNotice(owner[0], owner[1], failure.report()))
        # Handled either way: everything this actor owns is a replica the service manages
        # (a mesh not in `_owners` is Monarch's per-process logger or an already-stopped
        # replica), and an unhandled failure would exit the controller.
        return True
