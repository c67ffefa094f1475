"""Waiting with a deadline. Monarch's own waits on a host that is gone can last minutes or
never end, so every wait of the service is bounded, and says what it waited for."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(seconds: float, what: str, awaitable: Awaitable[T], setting: str = "") -> T:
    """`await awaitable`, cancelled after `seconds`: then `TimeoutError("<what>: no answer
    within <seconds> s (<setting>)")`, `setting` naming the config field that set the
    deadline. A `TimeoutError` of the awaitable's own passes unchanged."""
    deadline = asyncio.timeout(seconds)
    try:
        async with deadline:
            return await awaitable
    except TimeoutError:
        if deadline.expired():
            because = f" ({setting})" if setting else ""
            raise TimeoutError(f"{what}: no answer within {seconds:g} s{because}") from None
        raise
