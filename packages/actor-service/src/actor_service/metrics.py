"""Counters kept per replica, and the `status()` snapshot built from them."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

LATENCY_WINDOW = 2048
"""How many recent call latencies each replica keeps for its percentiles."""


def percentile(sorted_values: list[float], q: float) -> float:
    """The `q`-quantile (0 <= q <= 1) of already sorted values, nearest-rank; NaN if empty."""
    if not sorted_values:
        return float("nan")
    rank = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[rank]


@dataclass
class ReplicaCounters:
    """Live counters of one replica slot, summed over all its restarts."""

    completed: int = 0
    failed: int = 0
    lost: int = 0
    restarts: int = 0
    deaths: int = 0
    hangs: int = 0
    latencies_ms: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))

    def latency_percentiles(self) -> tuple[float, float]:
        """(p50, p99) in milliseconds over the recent window; NaN before the first call."""
        values = sorted(self.latencies_ms)
        return percentile(values, 0.50), percentile(values, 0.99)


@dataclass(frozen=True)
class ReplicaStatus:
    """One replica at the moment of `status()`.

    state: "starting", "healthy", "restarting" (died; a restart is pending or running),
        "failed" (restart budget spent; stays down) or "stopped".
    generation: how many times this slot was (re)started, 0 for the first start.
    pids: process ids of the replica's processes, rank order; empty while it is down.
    completed / failed / lost: calls answered with a result / with an error raised by the
        endpoint's code / cut off by the replica's death (they may have been retried).
    restarts: restart attempts of this slot, failed ones included (at most `max_restarts`).
    deaths: times a started replica in this slot died: its process or actor failed, or it
        hung (hangs included).
    hangs: deaths that were hangs: a call went unanswered past its timeout
        (`ServiceConfig.call_timeout_s` / `endpoint_timeouts`), so the replica was stopped.
    host: index of the host the slot runs on (or restarts on), among the hosts given to
        `spawn_service` (each host of a multi-host mesh counts as one); 0 without `hosts`.
    p50_ms / p99_ms: latency of answered calls over the recent window, send to answer.
    """

    index: int
    state: str
    generation: int
    pids: tuple[int, ...]
    in_flight: int
    queued: int
    completed: int
    failed: int
    lost: int
    restarts: int
    deaths: int
    hangs: int
    host: int
    p50_ms: float
    p99_ms: float
    last_error: str | None


@dataclass(frozen=True)
class ServiceStatus:
    """The whole service at the moment of `status()`.

    waiting: calls that found no healthy replica and wait for one.
    retried: re-sends of calls whose replica died under them.
    rejected: calls refused with `ServiceOverloadedError`.
    hosts_down: indexes of the hosts marked down (a spawn there failed); restarts avoid
        them while another host is up.
    p50_ms / p99_ms: over the union of the replicas' recent windows.
    """

    name: str
    closed: bool
    replicas: tuple[ReplicaStatus, ...]
    waiting: int
    retried: int
    rejected: int
    p50_ms: float
    p99_ms: float
    hosts_down: tuple[int, ...] = ()

    @property
    def healthy(self) -> int:
        return sum(r.state == "healthy" for r in self.replicas)

    @property
    def in_flight(self) -> int:
        return sum(r.in_flight for r in self.replicas)

    @property
    def queued(self) -> int:
        return sum(r.queued for r in self.replicas)

    @property
    def completed(self) -> int:
        return sum(r.completed for r in self.replicas)

    @property
    def failed(self) -> int:
        return sum(r.failed for r in self.replicas)

    @property
    def restarts(self) -> int:
        return sum(r.restarts for r in self.replicas)

    @property
    def deaths(self) -> int:
        return sum(r.deaths for r in self.replicas)

    @property
    def hangs(self) -> int:
        return sum(r.hangs for r in self.replicas)

    def __str__(self) -> str:
        head = (
            f"service {self.name}: {self.healthy}/{len(self.replicas)} healthy, "
            f"{self.waiting} waiting, {self.retried} retried, {self.rejected} rejected, "
            f"p50 {self.p50_ms:.2f} ms, p99 {self.p99_ms:.2f} ms"
        )
        if self.hosts_down:
            head += f", hosts down {list(self.hosts_down)}"
        rows = [
            f"  [{r.index}] {r.state:<10} host {r.host} gen {r.generation} pids {list(r.pids)} "
            f"in-flight {r.in_flight} queued {r.queued} done {r.completed} "
            f"failed {r.failed} lost {r.lost} deaths {r.deaths} hangs {r.hangs} "
            f"restarts {r.restarts} "
            f"p50 {r.p50_ms:.2f} ms p99 {r.p99_ms:.2f} ms"
            for r in self.replicas
        ]
        return "\n".join([head, *rows])
