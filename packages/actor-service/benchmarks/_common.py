"""What the actor-service benchmarks share: the no-op/sleep actor, a result row, quantiles and
a bounded phase (`bench_service.py` runs the cases)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass

import cloudpickle  # type: ignore[import-untyped]
from monarch.actor import Actor, endpoint

# Its actors travel to the Monarch workers by value: they cannot import this script's folder.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

PHASE_SLACK_S = 120.0  # a phase's deadline beyond its planned length: reaching it means stuck


class Bench(Actor):
    @endpoint
    async def noop(self) -> None:
        return None

    @endpoint
    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@contextlib.asynccontextmanager
async def deadline(seconds: float, what: str) -> AsyncIterator[None]:
    """Bounds a phase: `TimeoutError` naming `what` if it is not done within `seconds`."""
    limit = asyncio.timeout(seconds)
    try:
        async with limit:
            yield
    except TimeoutError:
        if limit.expired():
            raise TimeoutError(f"{what}: not done within {seconds:g} s") from None
        raise


@dataclass
class Row:
    case: str
    replicas: int
    p50_ms: float
    p99_ms: float
    throughput: float


def quantiles(ms: list[float]) -> tuple[float, float]:
    ordered = sorted(ms)
    return ordered[len(ordered) // 2], ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
