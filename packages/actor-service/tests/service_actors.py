"""Actors the tests serve. Pickled by value: the replica processes cannot import this
directory, so cloudpickle ships the classes themselves."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import cloudpickle  # type: ignore[import-untyped]
from actor_service import ServiceHandle, non_idempotent
from monarch.actor import Actor, current_rank, endpoint
from monarch.actor.concurrent import concurrent_endpoint

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Echo(Actor):
    """Answers with its pid so tests can see which replica served a call."""

    def __init__(self, tag: str = "") -> None:
        self.tag = tag
        self.calls = 0

    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def echo(self, x: int, delay: float = 0.0, crash_on: int = -1) -> tuple[int, int]:
        """Returns (x, pid); exits the process (no cleanup) if this is process `crash_on`."""
        if os.getpid() == crash_on:
            os._exit(17)
        if delay:
            await asyncio.sleep(delay)
        self.calls += 1
        return x, os.getpid()

    @endpoint
    async def calls_served(self) -> int:
        return self.calls

    @endpoint
    async def divide(self, a: float, b: float) -> float:
        return a / b

    @endpoint
    async def crash(self) -> None:
        os._exit(3)

    @endpoint
    async def env(self, name: str) -> tuple[int, str | None]:
        return current_rank().rank, os.environ.get(name)

    @non_idempotent
    @endpoint
    async def charge(self, amount: int, delay: float) -> int:
        await asyncio.sleep(delay)
        return amount

    @endpoint
    async def transfer(self, amount: int, delay: float) -> int:
        """Like `charge`, but left to the service config to declare non-idempotent."""
        await asyncio.sleep(delay)
        return amount


class Stuck(Actor):
    """Plain (sync) endpoints that block the replica, as a hung one would, in process
    `hang_on` only. (An actor cannot mix sync and async endpoints, hence its own class.)"""

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def work(self, x: int, hang_on: int = -1, seconds: float = 0.0) -> tuple[int, int]:
        """Returns (x, pid) after `seconds`; never returns in process `hang_on`."""
        if os.getpid() == hang_on:
            time.sleep(3600)
        time.sleep(seconds)
        return x, os.getpid()

    @non_idempotent
    @endpoint
    def pay(self, x: int, hang_on: int = -1) -> tuple[int, int]:
        """`work` for an endpoint that must not run twice."""
        if os.getpid() == hang_on:
            time.sleep(3600)
        return x, os.getpid()

    @endpoint
    def slow(self, seconds: float) -> int:
        time.sleep(seconds)
        return os.getpid()


class Parallel(Actor):
    """Concurrent endpoint that records how many calls ran at once in this replica."""

    def __init__(self) -> None:
        self.running = 0
        self.peak = 0

    @concurrent_endpoint
    async def work(self, delay: float) -> int:
        self.running += 1
        self.peak = max(self.peak, self.running)
        await asyncio.sleep(delay)
        self.running -= 1
        return os.getpid()

    @concurrent_endpoint
    async def peak_running(self) -> int:
        return self.peak


class BrokenInit(Actor):
    def __init__(self) -> None:
        raise RuntimeError("model file missing: /nonexistent/weights.pt")

    @endpoint
    async def ping(self) -> int:
        return 1


class StartsOnce(Actor):
    """Starts the first time; every later start (a restart) raises in `__init__`."""

    def __init__(self, marker: str) -> None:
        if os.path.exists(marker):
            raise RuntimeError("refusing to start twice")
        with open(marker, "w"):
            pass

    @endpoint
    async def pid(self) -> int:
        return os.getpid()


class Caller(Actor):
    """Another actor that uses a service through the handle it was given."""

    def __init__(self, handle: ServiceHandle) -> None:
        self.handle = handle

    @endpoint
    async def echo_many(self, n: int) -> list[int]:
        outs = await asyncio.gather(*(self.handle.echo.route(i) for i in range(n)))
        return [pid for _, pid in outs]

    @endpoint
    async def in_session(self, n: int) -> list[int]:
        async with self.handle.session() as s:
            return [(await s.echo.route(i))[1] for i in range(n)]

    @endpoint
    async def error_of_divide(self) -> str:
        try:
            await self.handle.divide.route(1.0, 0.0)
        except Exception as e:
            inner = getattr(e, "exception", None)
            return f"{type(e).__name__}:{type(inner).__name__}:{e}"
        return "no error"
