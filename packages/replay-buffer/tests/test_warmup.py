"""`Warmup`: the trainer waits for a fill of the buffer."""

import asyncio

import pytest
from replay_buffer import Warmup


async def test_warmup_opens_after_enough_episodes() -> None:
    warmup = Warmup(episodes=5)
    waiter = asyncio.create_task(warmup.wait())
    assert not warmup.record(3)
    await asyncio.sleep(0.01)
    assert not waiter.done()
    assert warmup.remaining == 2
    assert warmup.record(2)
    await asyncio.wait_for(waiter, 1)
    assert warmup.ready
    assert Warmup(0).ready


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_a_bad_count_is_refused_by_name(bad: object) -> None:
    with pytest.raises(ValueError, match="Warmup episodes must be an int >= 0"):
        Warmup(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"Warmup\.record n must be an int >= 0"):
        Warmup(1).record(bad)  # type: ignore[arg-type]
