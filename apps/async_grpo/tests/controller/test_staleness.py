"""The staleness gate's admission (pure, one event loop): a rollout starts only when what it
generates can still be trained, so an async run does not generate what it then drops."""

from __future__ import annotations

import asyncio

import pytest
from async_grpo.controller.ledger import Call, LedgerState, PromptLedger
from async_grpo.controller.staleness import StalenessGate

BATCH = 4  # groups per batch


def ledger(per_call: int = 2) -> PromptLedger:
    return PromptLedger(seed=0, prompts_per_call=per_call, batch_groups=None)


async def admitted(gate: StalenessGate, led: PromptLedger) -> Call | None:
    """The call `admit` hands out now, or None if it would wait."""
    try:
        return await asyncio.wait_for(gate.admit(led), 0.05)
    except TimeoutError:
        return None


def test_the_window_is_the_batches_an_episode_can_still_reach() -> None:
    # A call is sampled from the trainer's newest version t or newer (it brings the
    # weights along), so its episodes can be trained by the steps that start at t to
    # t + max_policy_age: one batch each.
    gate = StalenessGate(max_policy_age=1, batch_groups=BATCH, trainer=5)
    assert gate.room(outstanding=0) == 2 * BATCH
    assert gate.room(outstanding=3) == 2 * BATCH - 3
    gate.generators = 3  # the broadcast lagging behind changes nothing: calls pull first
    assert gate.room(outstanding=0) == 2 * BATCH
    gate.step_started()  # the step making version 6 counts as the trainer's version
    assert gate.room(outstanding=0) == BATCH
    gate.step_started()  # a step queued behind it (version 7): nothing can reach a step now
    assert gate.room(outstanding=0) == 0
    assert StalenessGate(max_policy_age=3, batch_groups=BATCH).room(0) == 4 * BATCH
    gate.warmup_groups = 3 * BATCH  # a warm-up fill asks for more than the window
    assert gate.room(outstanding=BATCH) == 2 * BATCH


async def test_admission_stops_at_the_window_and_reopens_as_the_trainer_moves() -> None:
    gate, led = StalenessGate(max_policy_age=1, batch_groups=BATCH), ledger(per_call=3)
    calls = [await admitted(gate, led) for _ in range(4)]
    # 2 batches of 4 groups: calls of 3, 3, then the 2 left, then none.
    assert [len(c.indices) if c else 0 for c in calls] == [3, 3, 2, 0]
    for c in calls[:3]:
        assert c is not None
        led.put(c, c.indices, version=0, incarnation="b")
    assert led.outstanding() == 2 * BATCH
    # The trainer takes a batch and starts a step: the window shrinks to one batch, which
    # the held batch fills.
    led.batch_taken([0, 1, 2, 3])
    led.trained([0, 1, 2, 3])
    gate.step_started()
    assert await admitted(gate, led) is None
    # The step ends and its weights reach the generators: room for a batch again.
    await gate.set(trainer=1, generators=1)
    nxt = await admitted(gate, led)
    assert nxt is not None
    assert nxt.indices == (8, 9, 10)


async def test_a_queued_step_closes_the_window_until_the_first_step_answers() -> None:
    # Trainer at 0; step 0 -> 1 computes, step 1 -> 2 is queued behind it with its batch.
    # A call now would run version 0 and could only be trained from version 2 on: too stale.
    gate, led = StalenessGate(max_policy_age=1, batch_groups=BATCH), ledger(per_call=4)
    gate.step_started()
    gate.step_started()
    assert gate.steps_sent == 2
    assert await admitted(gate, led) is None
    # Step 0 -> 1 answers: one step in flight, room for the batch its successor trains on.
    await gate.step_ended(1)
    assert (gate.trainer, gate.steps_sent) == (1, 1)
    call = await admitted(gate, led)
    assert call is not None
    assert len(call.indices) == BATCH
    await gate.step_ended(2)
    assert (gate.trainer, gate.steps_sent) == (2, 0)
    # A restore sets the trainer's version with nothing in flight.
    gate.step_started()
    await gate.set(trainer=0, generators=0)
    assert gate.steps_sent == 0


async def test_a_sync_step_never_generates_on_the_weights_it_replaces() -> None:
    gate = StalenessGate(max_policy_age=0, batch_groups=BATCH)
    led = PromptLedger(seed=0, prompts_per_call=4, batch_groups=BATCH)
    first = await admitted(gate, led)
    assert first is not None
    gate.step_started()
    # Version 0's batch is used up anyway; but even a redo must wait for version 1.
    led.put(first, [], version=0, incarnation="b")  # its group dropped: the quota frees it
    assert await admitted(gate, led) is None
    await gate.set(trainer=1, generators=1)
    assert await admitted(gate, led) is not None


async def test_stale_groups_evicted_free_their_room() -> None:
    gate, led = StalenessGate(max_policy_age=1, batch_groups=1), ledger(per_call=1)
    a, b = await admitted(gate, led), await admitted(gate, led)
    assert a is not None
    assert b is not None
    led.put(a, a.indices, version=0, incarnation="b", tokens={0: 12})
    led.put(b, b.indices, version=0, incarnation="b", tokens={1: 4})
    await gate.set(trainer=3, generators=3)
    assert gate.room(led.outstanding()) == 0  # both still counted ...
    stale = led.evict_stale(curr_version=3, max_age=1)  # ... until the buffer evicts them
    assert sorted((s.age, s.tokens) for s in stale) == [(3, 4), (3, 12)]
    assert gate.room(led.outstanding()) == 2


@pytest.mark.parametrize("limit", [0, -1])
def test_a_claim_with_no_room_hands_out_nothing(limit: int) -> None:
    led = ledger()
    assert led.claim(0, limit=limit) is None
    assert led.next_index == 0


def test_a_redo_call_larger_than_the_room_is_split() -> None:
    # A call to generate again (after a failure or a resume) is cut to the room there is.
    led = ledger(per_call=4)
    call = Call((0, 1, 2, 3), seed=9)
    led.load(LedgerState(next_index=4, redo=(call,), held=(), open_version=0, used=0))
    first = led.claim(0, limit=3)
    assert first is not None
    assert (first.indices, first.seed) == ((0, 1, 2), 9)
    rest = led.claim(0, limit=3)
    assert rest is not None
    assert rest.indices == (3,)
    assert led.claim(0, limit=3) is not None  # then new prompts
