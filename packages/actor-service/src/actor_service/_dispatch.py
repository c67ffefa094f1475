"""The request path: admit a call, pick a replica, send it, and re-route it if the replica
dies. Everything here runs on the service's event loop, so it holds no locks.

A request is owned by exactly one place at a time (a replica's backlog, a replica's
in-flight set, or the waiting list), and moving it is how ownership passes: the attempt
that finds its request gone from the in-flight set knows someone else took it over, which
is what makes every request resolve exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError

from actor_service._watchdog import HangWatch
from actor_service.config import ServiceConfig
from actor_service.errors import (
    CallTimeoutError,
    NoHealthyReplicaError,
    ReplicaDiedError,
    ServiceClosedError,
    ServiceOverloadedError,
)
from actor_service.replica import OMITTED, Replica, ReplicaState, Request
from actor_service.routers import Router


class Dispatcher:
    """Routes requests over `replicas`; `on_down(replica)` is told of each replica death
    (after the replica's state says whether it will restart)."""

    def __init__(
        self,
        config: ServiceConfig,
        replicas: Sequence[Replica],
        router: Router,
        on_down: Callable[[Replica], None],
    ) -> None:
        self._config = config
        self._name = config.name
        self._replicas = replicas
        self._router = router
        self._on_down = on_down
        self._loop = asyncio.get_running_loop()
        self._healthy: list[Replica] = []
        self._waiting: deque[Request] = deque()
        self._wakers: list[asyncio.Future[None]] = []
        self._watch = HangWatch(config, self._hung)
        self.retried = 0
        self.rejected = 0
        self.accepting = True
        self.closed = False

    # ------------------------------------------------------------------ admission
    def submit(self, req: Request, *, admitted: bool = False) -> None:
        """Places `req`: sends it, queues it on a replica, or parks it until a replica is
        healthy. A new request (`admitted=False`) that cannot be accepted raises here; a
        request already accepted (a retry, a re-route) is failed through its future."""
        if self.closed or not (admitted or self.accepting):
            self._reject(req, ServiceClosedError(f"service {self._name} is shut down"), admitted)
            return
        target = req.pinned
        if target is None:
            if not self._healthy:
                self._park(req, admitted)
                return
            picked = self._router.pick(self._healthy, req.session)
            if not isinstance(picked, Replica) or not picked.healthy:
                raise RuntimeError(f"router {self._router!r} picked {picked!r}, not a healthy one")
            target = picked
        elif not target.healthy:
            req.resolve(OMITTED)
            return
        if target.has_slot and not target.backlog:
            self._send(target, req)
            return
        if not admitted and self.queued_total() >= self._config.max_queued:
            self.rejected += 1
            raise ServiceOverloadedError(
                f"service {self._name}: every replica is at its cap of "
                f"{self._config.max_in_flight_per_replica} in flight and "
                f"{self.queued_total()} requests already wait (max_queued="
                f"{self._config.max_queued})"
            )
        target.backlog.append(req)

    def queued_total(self) -> int:
        return len(self._waiting) + sum(len(r.backlog) for r in self._replicas)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def _reject(self, req: Request, error: Exception, admitted: bool) -> None:
        if not admitted:
            raise error
        req.fail(error)

    def _park(self, req: Request, admitted: bool) -> None:
        if self.hopeless():
            self._reject(req, NoHealthyReplicaError(self._hopeless_message()), admitted)
            return
        if not admitted and self.queued_total() >= self._config.max_queued:
            self.rejected += 1
            raise ServiceOverloadedError(
                f"service {self._name}: no healthy replica and {self.queued_total()} "
                f"requests already wait (max_queued={self._config.max_queued})"
            )
        self._waiting.append(req)
        req.expiry = self._loop.call_later(self._config.no_healthy_timeout_s, self._expire, req)

    def _expire(self, req: Request) -> None:
        req.expiry = None
        try:
            self._waiting.remove(req)
        except ValueError:
            return
        req.fail(NoHealthyReplicaError(self._timeout_message()))

    # ------------------------------------------------------------------ sending
    def _send(self, replica: Replica, req: Request) -> None:
        replica.active[req] = None
        req.replica = replica
        req.task = self._loop.create_task(self._attempt(replica, replica.generation, req))
        self._watch.sent(replica, req)

    async def _attempt(self, replica: Replica, generation: int, req: Request) -> None:
        start = time.perf_counter()
        try:
            result = await replica.invoke(req.endpoint, req.args, req.kwargs)
        except asyncio.CancelledError:
            return  # the replica died or the service closed; that handler owns `req` now
        except SupervisionError as e:
            if req in replica.active:
                self.replica_down(replica, generation, str(e))
            return
        except Exception as e:  # the endpoint's own error (ActorError), or a local one
            if self._release(replica, req):
                replica.counters.failed += 1
                req.fail(e)
            return
        if self._release(replica, req):
            replica.counters.completed += 1
            replica.counters.latencies_ms.append((time.perf_counter() - start) * 1e3)
            req.resolve(result)

    def _release(self, replica: Replica, req: Request) -> bool:
        """Ends `req`'s attempt on `replica`; False if someone else already took `req`."""
        if req not in replica.active:
            return False
        was_oldest = next(iter(replica.active)) is req
        del replica.active[req]
        req.replica = None
        req.task = None
        self._watch.answered(replica, was_oldest)
        self._pump(replica)
        return True

    def _pump(self, replica: Replica) -> None:
        while replica.healthy and replica.has_slot and replica.backlog:
            req = replica.backlog.popleft()
            if not req.future.done():  # a caller that gave up is not sent
                self._send(replica, req)

    # ------------------------------------------------------------------ replica events
    def replica_up(self, replica: Replica) -> None:
        """`replica` (just attached) serves from now on; parked requests go to it."""
        if not replica.healthy or replica in self._healthy:
            return  # it died again before it was announced; its restart will announce it
        self._healthy.append(replica)
        self._healthy.sort(key=lambda r: r.index)
        parked = list(self._waiting)
        self._waiting.clear()
        for req in parked:
            if req.expiry is not None:
                req.expiry.cancel()
                req.expiry = None
            if not req.future.done():
                self.submit(req, admitted=True)
        self._wake()

    def _hung(self, replica: Replica, generation: int, req: Request, seconds: float) -> None:
        """`req` went unanswered for `seconds` on `replica`: the replica counts as hung and
        is handled as dead (its processes are stopped by the restart that follows)."""
        replica.counters.hangs += 1
        reason = (
            f"hung: no answer to `{req.endpoint}` within {seconds:g} s, so its processes "
            "are stopped"
        )
        self.replica_down(replica, generation, reason, timed_out=(req, seconds))

    def replica_down(
        self,
        replica: Replica,
        generation: int,
        reason: str,
        *,
        timed_out: tuple[Request, float] | None = None,
    ) -> None:
        """`replica`'s mesh of `generation` died, or hung with `timed_out`'s request
        unanswered for its timeout. Idempotent: the first report wins (a death is reported
        by the supervisor and by every call that was in flight)."""
        if replica.generation != generation or not replica.healthy:
            return
        self._watch.disarm(replica)
        out_of_restarts = replica.counters.restarts >= self._config.max_restarts
        replica.state = ReplicaState.FAILED if out_of_restarts else ReplicaState.RESTARTING
        replica.last_error = replica.death_reason = reason
        replica.died_at = time.time()
        replica.counters.deaths += 1
        if replica in self._healthy:  # not yet announced if it died during spawn_service
            self._healthy.remove(replica)
        lost, backlog = list(replica.active), list(replica.backlog)
        replica.active.clear()
        replica.backlog.clear()
        self._on_down(replica)
        current = asyncio.current_task()
        for req in lost:
            if req.task is not None and req.task is not current:
                req.task.cancel()
            req.replica = None
            req.task = None
            if timed_out is not None and timed_out[0] is req:
                self._lost(replica, req, reason, timeout_s=timed_out[1])
            else:
                self._lost(replica, req, reason)
        for req in backlog:  # never sent, so safe to re-route even if non-idempotent
            if req.pinned is not None:
                req.resolve(OMITTED)
            elif not req.future.done():
                self.submit(req, admitted=True)
        self.check_hopeless()

    def _lost(
        self, replica: Replica, req: Request, reason: str, timeout_s: float | None = None
    ) -> None:
        """`req` was in flight on `replica` when it died (or hung: `timeout_s` is set for
        the call that timed out): re-sent, or failed, by the rules in the README."""
        replica.counters.lost += 1
        retries_left = req.idempotent and req.attempts < self._config.max_retries
        if req.pinned is not None:
            req.resolve(OMITTED)
        elif req.future.done():
            return
        elif timeout_s is not None and not retries_left:
            sends = req.attempts + 1
            why = (
                f"it was sent {sends} time{'s' if sends > 1 else ''} "
                f"(max_retries={self._config.max_retries})"
                if req.idempotent
                else "the endpoint is non-idempotent, so it was not re-sent (it may or may "
                "not have run)"
            )
            req.fail(
                CallTimeoutError(
                    f"service {self._name}: replica {replica.index} gave no answer to "
                    f"`{req.endpoint}` within its timeout of {timeout_s:g} s, so the replica "
                    f"was taken as hung and stopped; {why}"
                )
            )
        elif not req.idempotent:
            req.fail(
                ReplicaDiedError(
                    f"service {self._name}: replica {replica.index} died while "
                    f"`{req.endpoint}` was in flight; the endpoint is non-idempotent, so it "
                    f"was not retried (it may or may not have run). Cause: {reason}"
                )
            )
        elif req.attempts >= self._config.max_retries:
            req.fail(
                ReplicaDiedError(
                    f"service {self._name}: `{req.endpoint}` was lost to a dying replica "
                    f"{req.attempts + 1} times (max_retries={self._config.max_retries}). "
                    f"Last cause: {reason}"
                )
            )
        else:
            req.attempts += 1
            self.retried += 1
            self.submit(req, admitted=True)

    def hopeless(self) -> bool:
        """True when no replica is healthy and none is starting or restarting."""
        return not any(
            r.state in (ReplicaState.HEALTHY, ReplicaState.STARTING, ReplicaState.RESTARTING)
            for r in self._replicas
        )

    def check_hopeless(self) -> None:
        """Fails parked requests at once when no replica can come back."""
        if not self.hopeless():
            return
        parked = list(self._waiting)
        self._waiting.clear()
        for req in parked:
            if req.expiry is not None:
                req.expiry.cancel()
            req.fail(NoHealthyReplicaError(self._hopeless_message()))
        self._wake()

    def _states(self) -> str:
        return ", ".join(f"{r.index}: {r.state.value}" for r in self._replicas)

    def _hopeless_message(self) -> str:
        return (
            f"service {self._name}: no replica is healthy and none can come back "
            f"(max_restarts={self._config.max_restarts}); states: {self._states()}; "
            f"last error: {self._last_error()}"
        )

    def _timeout_message(self) -> str:
        return (
            f"service {self._name}: no healthy replica within no_healthy_timeout_s="
            f"{self._config.no_healthy_timeout_s:g}; states: {self._states()}; "
            f"last error: {self._last_error()}"
        )

    def _last_error(self) -> str | None:
        errors = [r.last_error for r in self._replicas if r.last_error]
        return errors[-1] if errors else None

    # ------------------------------------------------------------------ waiting for health
    async def healthy_replicas(self) -> list[Replica]:
        """The healthy replicas, index order, waiting up to `no_healthy_timeout_s` for one."""
        deadline = self._loop.time() + self._config.no_healthy_timeout_s
        while True:
            if self.closed:
                raise ServiceClosedError(f"service {self._name} is shut down")
            if self._healthy:
                return list(self._healthy)
            if self.hopeless():
                raise NoHealthyReplicaError(self._hopeless_message())
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                raise NoHealthyReplicaError(self._timeout_message())
            waker = self._loop.create_future()
            self._wakers.append(waker)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waker, remaining)

    def _wake(self) -> None:
        for waker in self._wakers:
            if not waker.done():
                waker.set_result(None)
        self._wakers.clear()

    # ------------------------------------------------------------------ sessions & closing
    def end_session(self, session: Hashable) -> None:
        self._router.end_session(session)

    def pending(self) -> list[asyncio.Future[Any]]:
        """The futures of accepted requests not yet resolved (in flight, queued, parked)."""
        requests = list(self._waiting)
        for replica in self._replicas:
            requests += replica.backlog
            requests += replica.active
        return [req.future for req in requests if not req.future.done()]

    def close(self) -> None:
        """Stops accepting; every request not yet answered fails with ServiceClosedError."""
        self.closed = True
        error = ServiceClosedError(f"service {self._name} was shut down before answering")
        requests = list(self._waiting)
        self._waiting.clear()
        for replica in self._replicas:
            self._watch.disarm(replica)
            requests += replica.backlog
            requests += replica.active
            replica.backlog.clear()
            replica.active.clear()
        for req in requests:
            if req.expiry is not None:
                req.expiry.cancel()
            if req.task is not None:
                req.task.cancel()
            req.fail(error)
        self._healthy.clear()
        self._wake()
