"""`controller.send_order`: generation requests leave in the order their calls were claimed,
whichever call's prompts come first; a call that ends without sending, or waits too long,
holds up nobody."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import pytest
from async_grpo.config.presets import tiny
from async_grpo.controller.ledger import Call, PromptLedger
from async_grpo.controller.rollout import rollout_prompts
from async_grpo.controller.send_order import SendOrder
from async_grpo.launch.spawn import Components
from async_grpo.observability.metrics import RunMetrics
from async_grpo.tasks.prompts import Sample
from jobs import Parts


def call(first: int, count: int = 8) -> Call:
    return Call(tuple(range(first, first + count)), seed=first)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


class Sent(Exception):
    """Ends a rollout right after its generation request (the test needs nothing after)."""


class Endpoint:
    def __init__(self, route: Any) -> None:
        self.route = route


class Service:
    def __init__(self, route: Any) -> None:
        self._route = route

    def endpoint(self, _: object) -> Endpoint:
        return Endpoint(self._route)


class Fakes:
    """A dataset that answers a call's prompts when the test releases them, and a generator
    that records which call's request reached it, in order."""

    def __init__(self) -> None:
        self.release: dict[int, asyncio.Event] = {}
        self.requests: list[str] = []

    async def samples(self, indices: list[int]) -> list[Sample]:
        await self.release.setdefault(indices[0], asyncio.Event()).wait()
        return [Sample(f"p{i}", str(i)) for i in indices]

    async def generate(self, prompts: list[str], seed: int, weights: object) -> None:
        self.requests.append(prompts[0])
        raise Sent

    def parts(self) -> Parts:
        cfg = tiny()
        components = SimpleNamespace(
            dataset=Service(self.samples), generator=Service(self.generate)
        )
        ledger = PromptLedger(cfg.seed, cfg.generator.prompts_per_call, None)
        return Parts(cfg, cast(Components, components), ledger, RunMetrics(cfg.window))


async def two_calls_second_prompts_first(order: SendOrder | None) -> list[str]:
    fakes = Fakes()
    parts = fakes.parts()
    rollouts = [
        asyncio.ensure_future(rollout_prompts(parts, c, None, order)) for c in (call(0), call(8))
    ]
    await settle()
    fakes.release.setdefault(8, asyncio.Event()).set()  # the second call's prompts first
    await settle()
    fakes.release.setdefault(0, asyncio.Event()).set()
    results = await asyncio.gather(*rollouts, return_exceptions=True)
    assert all(isinstance(r, Sent) for r in results), results
    return fakes.requests


async def test_requests_leave_in_claim_order_whichever_prompts_come_first() -> None:
    assert await two_calls_second_prompts_first(SendOrder()) == ["p0", "p8"]
    # Without the order, the call whose prompts came first sends first.
    assert await two_calls_second_prompts_first(None) == ["p8", "p0"]


async def test_the_request_is_handed_over_before_what_was_woken_with_the_rollout() -> None:
    # A step's end wakes the rollout and then the broadcast, whose fanout brings the same
    # weights: the rollout's request must reach the service first (in the same turn), so the
    # generator pulls them for the request instead of handling the fanout before it.
    fakes = Fakes()
    loop = asyncio.get_running_loop()

    class Racing(SendOrder):
        async def turn(self, call: Call) -> None:
            loop.call_soon(fakes.requests.append, "fanout")  # woken just after the rollout
            await super().turn(call)

    fakes.release[0] = asyncio.Event()
    fakes.release[0].set()
    result = await asyncio.gather(
        rollout_prompts(fakes.parts(), call(0), None, Racing()), return_exceptions=True
    )
    await settle()
    assert isinstance(result[0], Sent)
    assert fakes.requests == ["p0", "fanout"]


async def test_a_call_that_ends_without_sending_lets_the_next_go() -> None:
    order = SendOrder()
    first, second = call(0), call(8)
    order.claimed(first)
    order.claimed(second)
    waiting = asyncio.ensure_future(order.turn(second))
    await settle()
    assert not waiting.done()
    order.done(first)  # failed before its request, as a rollout's `finally` reports it
    await asyncio.wait_for(waiting, 1.0)


async def test_a_call_drawn_again_goes_before_newer_ones() -> None:
    order = SendOrder()
    newer, again = call(16), call(0)
    order.claimed(newer)
    order.claimed(again)  # lower prompt indices: the ledger hands it out before new ones
    await asyncio.wait_for(order.turn(again), 1.0)
    waiting = asyncio.ensure_future(order.turn(newer))
    await settle()
    assert not waiting.done()
    order.done(again)
    await asyncio.wait_for(waiting, 1.0)


async def test_a_turn_that_does_not_come_in_time_goes_ahead() -> None:
    order = SendOrder(wait_s=0.05)
    order.claimed(call(0))  # never sends
    order.claimed(call(8))
    loop = asyncio.get_running_loop()
    start = loop.time()
    await asyncio.wait_for(order.turn(call(8)), 1.0)
    assert loop.time() - start >= 0.05


def test_a_wait_of_zero_or_less_is_named() -> None:
    with pytest.raises(ValueError, match="wait_s must be > 0, got 0"):
        SendOrder(wait_s=0)
