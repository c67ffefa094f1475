"""Starting, restarting and stopping replicas (through the supervisor actor)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from typing import Any

from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError
from monarch.actor import (
    Actor,
    ActorError,
    Channel,
    HostMesh,
    PortReceiver,
    as_endpoint,
    this_proc,
)

from actor_service import _faults
from actor_service._deadline import within
from actor_service._dispatch import Dispatcher
from actor_service._placement import Placement
from actor_service._supervisor import (
    ActorSpec,
    DeathNotice,
    ProcSpec,
    ReplicaSupervisor,
    SpawnedReplica,
)
from actor_service.config import ServiceConfig
from actor_service.errors import ReplicaStartError
from actor_service.events import Listeners, one_line
from actor_service.replica import Replica, ReplicaState

log = logging.getLogger(__name__)

# Beyond the supervisor's own deadline for a stop: only a supervisor that does not answer
# at all (its process is stuck) reaches it.
GRACE_S = 5.0


async def construction_error(mesh: Any) -> str | None:
    """Waits until the actor's `__init__` has run on every rank of `mesh`; returns None, or
    Monarch's report (remote traceback included) if it raised.

    Monarch gives no "constructed" signal (`mesh.initialized` only means the mesh exists),
    and the user's actor may have no side-effect-free endpoint. A message is handled only
    after `__init__`, so we send one to a method every `Actor` has,
    `_handle_undeliverable_message`, without its argument: an actor that was constructed
    answers with a `TypeError` (an `ActorError`) and runs nothing; one whose `__init__`
    raised answers with a `SupervisionError`. (If the failure is already known when the
    message arrives, Monarch also bounces it back as undeliverable; `_faults` keeps that
    from exiting the controller.)
    """
    try:
        await as_endpoint(mesh._handle_undeliverable_message).call()
    except ActorError:
        return None
    except SupervisionError as e:
        return str(e)
    return None


class HostSpawnError(Exception):
    """No candidate host could spawn a replica's processes (each is marked down)."""


class Launcher:
    """Owns the supervisor actor; starts replicas on their hosts, restarts dead ones with
    exponential backoff up to `max_restarts` (on another host if theirs cannot spawn
    processes any more; telling `events` when one is up again or given up), and stops
    everything at shutdown.

    `hosts` are single-host meshes (None: every replica on this host, as `this_host()`).
    """

    def __init__(
        self,
        config: ServiceConfig,
        replicas: Sequence[Replica],
        actor_cls: type[Actor],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        events: Listeners,
        hosts: list[HostMesh] | None = None,
    ) -> None:
        self._config = config
        self._hosts = hosts
        self.placement = Placement(len(hosts) if hosts else 1, len(replicas))
        for replica in replicas:
            replica.host = self.placement.host_of[replica.index]
        self._events = events
        self._replicas = replicas
        self._actor_cls = actor_cls
        self._args = args
        self._kwargs = kwargs
        self._generations = [0] * len(replicas)
        # Unique per service, so that failures can be told apart from other services'.
        self.mesh_prefix = f"{config.name}_{uuid.uuid4().hex[:8]}_"
        self._dispatcher: Dispatcher | None = None
        self._supervisor: Any = None
        self._watcher: asyncio.Task[None] | None = None
        self._stops: set[asyncio.Task[None]] = set()
        self._closed = False

    def open(self, dispatcher: Dispatcher) -> None:
        """Spawns the supervisor in this process and starts listening to its notices."""
        self._dispatcher = dispatcher
        _faults.watch(self.mesh_prefix)
        port, receiver = Channel[DeathNotice].open()
        self._supervisor = this_proc().spawn(
            f"{self._config.name}_supervisor",
            ReplicaSupervisor,
            port,
            self._config.stop_timeout_s,
        )
        self._watcher = asyncio.get_running_loop().create_task(self._watch(receiver))

    async def _watch(self, receiver: PortReceiver[DeathNotice]) -> None:
        assert self._dispatcher is not None
        while True:
            notice = await receiver.recv()
            try:
                replica = self._replicas[notice.index]
                self._dispatcher.replica_down(replica, notice.generation, notice.report)
            except Exception:  # keep listening: one bad notice must not stop supervision
                log.exception("handling %s", notice)

    async def start(self, replica: Replica) -> None:
        """First start of `replica`, on its round-robin host; `ReplicaStartError` if it
        cannot start there within `start_timeout_s` (its processes are stopped again)."""
        await self._start_on(replica, [replica.host])

    async def _start_on(self, replica: Replica, hosts: list[int]) -> None:
        """Starts a new generation of `replica` on the first of `hosts` that can spawn its
        processes (marking down each that cannot) and attaches it; `ReplicaStartError`
        if that fails or takes longer than `start_timeout_s` in all."""
        generation = self._generations[replica.index]
        self._generations[replica.index] += 1
        cfg = self._config
        trying: list[int] = []  # the host whose spawn is under way, while one is
        try:
            async with asyncio.timeout(cfg.start_timeout_s):
                host = await self._spawn_procs(replica, generation, hosts, trying)
                spec = ActorSpec(
                    prefix=self.mesh_prefix,
                    index=replica.index,
                    generation=generation,
                    actor_cls=self._actor_cls,
                    args=self._args,
                    kwargs=self._kwargs,
                )
                spawned: SpawnedReplica = await self._supervisor.spawn_actor.call_one(spec)
                error = await construction_error(spawned.mesh)
            if error is not None:
                raise ReplicaStartError(error)
        except Exception as e:  # any failure to start is this replica's start failure
            self._stop_later(replica.index, generation)
            if isinstance(e, TimeoutError) and trying:
                limit = f"start_timeout_s={cfg.start_timeout_s:g}"
                self._host_down(trying[0], f"spawning its processes timed out ({limit})")
            reason = "timed out" if isinstance(e, TimeoutError) else str(e)
            raise ReplicaStartError(
                f"service {cfg.name}: replica {replica.index} (generation {generation}) of "
                f"{self._actor_cls.__name__} failed to start: {reason}"
            ) from None
        self.placement.move(replica.index, host)
        replica.host = host
        replica.attach(generation, spawned.mesh, spawned.pids)

    async def _spawn_procs(
        self, replica: Replica, generation: int, hosts: list[int], trying: list[int]
    ) -> int:
        """Spawns the processes on the first of `hosts` that can within `spawn_timeout_s`
        (the supervisor's deadline); returns that host."""
        cfg = self._config
        failures = []
        for host in hosts:
            spec = ProcSpec(
                prefix=self.mesh_prefix,
                index=replica.index,
                generation=generation,
                host=self._hosts[host] if self._hosts else None,
                procs=cfg.procs_per_replica,
                with_gpus=cfg.with_gpus,
                first_gpu=cfg.first_gpu
                + self.placement.block_on(replica.index, host)
                * cfg.procs_per_replica
                * cfg.gpus_per_proc,
                timeout_s=cfg.spawn_timeout_s,
                gpus_per_proc=cfg.gpus_per_proc,
            )
            trying[:] = [host]  # left set if the start timeout cancels this spawn
            try:
                await self._supervisor.spawn_procs.call_one(spec)
            except Exception as e:
                trying.clear()
                reason = one_line(str(e))
                self._host_down(host, reason)
                failures.append(f"host {host}: {reason}")
                continue
            trying.clear()
            self.placement.mark_up(host)
            return host
        raise HostSpawnError(f"no host could spawn its processes ({'; '.join(failures)})")

    def _host_down(self, host: int, reason: str) -> None:
        if self._hosts is None:
            return  # this host only: there is nowhere else to go
        if host not in self.placement.down:
            log.warning("service %s: host %d marked down: %s", self._config.name, host, reason)
        self.placement.mark_down(host)

    def restart_later(self, replica: Replica) -> None:
        """Called when `replica` died: stops its dead processes and, if it still has restart
        budget, restarts it in the background."""
        self._stop_later(replica.index, replica.generation)
        if replica.state is ReplicaState.RESTARTING and not self._closed:
            replica.restart_task = asyncio.get_running_loop().create_task(self._restart(replica))

    async def _restart(self, replica: Replica) -> None:
        cfg = self._config
        assert self._dispatcher is not None
        while replica.counters.restarts < cfg.max_restarts:
            await asyncio.sleep(cfg.restart_delay(replica.counters.restarts))
            replica.counters.restarts += 1
            try:
                await self._start_on(replica, self.placement.candidates(replica.index))
            except ReplicaStartError as e:
                replica.last_error = str(e)
                log.warning("%s", e)
                continue
            self._dispatcher.replica_up(replica)
            if replica.healthy:  # else it died again at once, and that death was told
                self._events.emit(replica, "up")
            return
        replica.state = ReplicaState.FAILED
        self._events.emit(replica, "gave_up")
        self._dispatcher.check_hopeless()

    def _stop_later(self, index: int, generation: int) -> None:
        task = asyncio.get_running_loop().create_task(self._stop(index, generation))
        self._stops.add(task)
        task.add_done_callback(self._stops.discard)

    async def _stop(self, index: int, generation: int) -> None:
        name = self._config.name
        try:
            await within(
                self._config.stop_timeout_s + GRACE_S,
                f"the supervisor, stopping replica {index} (generation {generation})",
                self._supervisor.stop_replica.call_one(index, generation),
            )
        except Exception as e:
            cause = e.exception if isinstance(e, ActorError) else e
            if isinstance(cause, TimeoutError):  # its processes may still run, so say so
                log.warning("service %s: %s; its host may be gone", name, one_line(str(e)))
            else:  # a dead mesh may fail to stop cleanly; nothing to undo
                log.debug("stopping replica %d/%d: %s", index, generation, e)

    async def close(self) -> None:
        """Cancels pending restarts, stops every replica process, then the supervisor.
        Each step is bounded by `stop_timeout_s`; one that gives no answer (its host is
        gone) is logged as a warning naming it, and closing goes on."""
        self._closed = True
        cfg = self._config
        restarts = [r.restart_task for r in self._replicas if r.restart_task is not None]
        tasks = [t for t in [*restarts, self._watcher] if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=GRACE_S)
            if stuck:
                log.warning(
                    "service %s: %d task(s) still running %g s after being cancelled",
                    cfg.name,
                    len(stuck),
                    GRACE_S,
                )
        if self._supervisor is None:
            return
        if self._stops:  # each bounded by `_stop` itself
            await asyncio.gather(*self._stops, return_exceptions=True)
        for replica in self._replicas:
            replica.state = ReplicaState.STOPPED
        bound = cfg.stop_timeout_s + GRACE_S
        try:
            failures: list[str] = await within(
                bound,
                "the supervisor, stopping every replica",
                self._supervisor.stop_all.call_one(),
            )
            for failure in failures:
                log.warning("service %s: %s", cfg.name, one_line(failure))
        except Exception as e:
            log.warning("service %s: %s", cfg.name, one_line(str(e)))
        try:
            # Stopping the supervisor would also stop any mesh it still owns.
            await within(bound, "stopping the supervisor", self._supervisor.stop())
        except Exception as e:
            log.warning("service %s: %s", cfg.name, one_line(str(e)))
