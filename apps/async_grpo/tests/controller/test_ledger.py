"""The prompt ledger (pure): which prompts a call holds, sync mode's one batch per version,
and what a failure or a checkpoint does to them: nothing skipped, nothing trained twice."""

from __future__ import annotations

from async_grpo.config.presets import tiny
from async_grpo.controller.ledger import Call, Held, LedgerState, PromptLedger
from async_grpo.controller.recovery import episodes_lost_bound
from async_grpo.seeds import derive_seed
from rl_envs import Task


def claim(ledger: PromptLedger, generators: int = 0) -> Call:
    call = ledger.claim(generators)
    assert call is not None
    return call


def test_async_calls_take_consecutive_prompts_with_derived_seeds() -> None:
    ledger = PromptLedger(seed=7, prompts_per_call=3, batch_groups=None)
    a, b = claim(ledger), claim(ledger)
    assert (a.indices, b.indices) == ((0, 1, 2), (3, 4, 5))
    assert a.seed == derive_seed(7, "call", 0) != b.seed
    assert a.version is None
    assert PromptLedger(seed=8, prompts_per_call=3, batch_groups=None).claim(0) != a


def test_sync_mode_hands_out_one_batch_per_version() -> None:
    ledger = PromptLedger(seed=0, prompts_per_call=3, batch_groups=4)
    first = claim(ledger)
    second = claim(ledger)
    # The batch has 4 groups: the second call is cut to the one left, and then none.
    assert (first.indices, second.indices) == ((0, 1, 2), (3,))
    assert {first.version, second.version} == {0}
    assert ledger.claim(0) is None
    # Generators on the next version open its batch.
    third = claim(ledger, generators=1)
    assert (third.indices, third.version) == ((4, 5, 6), 1)


def test_a_dropped_group_is_replaced_in_its_batch() -> None:
    ledger = PromptLedger(seed=0, prompts_per_call=2, batch_groups=2)
    call = claim(ledger)
    assert ledger.claim(0) is None
    ledger.put(call, [0], version=0, incarnation="b1")  # group 1 failed and was dropped
    replacement = claim(ledger)
    assert (replacement.indices, replacement.version) == ((2,), 0)


def test_a_dead_buffers_groups_are_drawn_again_once() -> None:
    ledger = PromptLedger(seed=0, prompts_per_call=2, batch_groups=None)
    a, b, c = claim(ledger), claim(ledger), claim(ledger)
    ledger.put(a, a.indices, version=0, incarnation="b1")
    ledger.put(b, b.indices, version=0, incarnation="b1")
    ledger.take([2])  # the trainer took group 2 before the death: it is not lost
    assert ledger.lose_buffer() == 3  # groups 0, 1 and 3
    again = [claim(ledger), claim(ledger)]
    assert [x.indices for x in again] == [(0, 1), (3,)]
    assert all(x.recorded for x in again)  # already in the metrics: not counted twice
    assert again[0].seed == a.seed  # the same samples again
    # A put the dead buffer answered, arriving after the death, is drawn again too.
    ledger.put(c, c.indices, version=0, incarnation="b1")
    assert claim(ledger).indices == (4, 5)
    assert claim(ledger).indices == (6, 7)  # then new prompts
    assert ledger.lost_groups == 5


def test_the_state_at_a_cut_redraws_what_had_not_reached_the_buffer() -> None:
    ledger = PromptLedger(seed=0, prompts_per_call=2, batch_groups=None)
    # Call 0 lands in the buffer before the snapshot without having answered yet.
    _landed, flying, held, stale, late = (claim(ledger) for _ in range(5))
    ledger.put(held, held.indices, version=3, incarnation="b")
    ledger.put(stale, stale.indices, version=1, incarnation="b")
    ledger.evict_stale(curr_version=3, max_age=1)  # the buffer evicted it at the last sample
    # The late call's put reached the buffer after its snapshot, and answered before the
    # ledger's state was taken.
    ledger.put(late, late.indices, version=3, incarnation="b")
    # The buffer's snapshot: the held call, and a call whose put landed before the snapshot
    # but had not answered yet.
    state = ledger.state({0: 4, 1: 4, 4: 3, 5: 3})
    assert state.next_index == 10
    assert [c.indices for c in state.redo] == [flying.indices, late.indices]
    assert sorted(i for h in state.held for i in h.call.indices) == [0, 1, 4, 5]
    assert {h.version for h in state.held} == {3, 4}
    resumed = PromptLedger(seed=0, prompts_per_call=2, batch_groups=None)
    resumed.load(state)
    assert claim(resumed) == flying
    assert claim(resumed) == late
    assert claim(resumed).indices == (10, 11)


def test_taken_but_untrained_groups_are_drawn_again() -> None:
    ledger = PromptLedger(seed=0, prompts_per_call=2, batch_groups=None)
    a, b = claim(ledger), claim(ledger)
    for call in (a, b):
        ledger.put(call, call.indices, version=0, incarnation="b")
    ledger.take([0, 1, 2, 3])
    ledger.trained([0, 1])
    ledger.untake()  # the run stopped before training 2 and 3
    assert claim(ledger) == b


def test_a_group_taken_before_its_put_answered_is_trained_once() -> None:
    """The buffer answers a put and a sample separately, so the trainer can take a group
    before the rollout books the put's answer (seen as a prompt trained twice after a
    resume: the late put held the trained group again, and the next cut redrew it)."""
    ledger = PromptLedger(seed=0, prompts_per_call=2, batch_groups=None)
    a, b = claim(ledger), claim(ledger)
    ledger.put(b, b.indices, version=0, incarnation="b")
    ledger.take([0, 1, 2, 3])  # a's groups too, its put not yet booked
    # A cut now: all four are taken and untrained, so each is drawn again once.
    state = ledger.state({})
    assert [c.indices for c in state.redo] == [a.indices, b.indices]
    assert state.held == ()
    ledger.trained([0, 1, 2, 3])
    ledger.put(a, a.indices, version=0, incarnation="b")  # the late answer
    state = ledger.state({})
    assert (state.redo, state.held) == ((), ())
    assert ledger.lose_buffer() == 0  # nothing held: nothing to draw again
    assert claim(ledger).indices == (4, 5)


def test_stale_groups_are_forgotten_as_the_buffer_evicts_them() -> None:
    ledger = PromptLedger(seed=0, prompts_per_call=1, batch_groups=None)
    old, new = claim(ledger), claim(ledger)
    ledger.put(old, old.indices, version=0, incarnation="b")
    ledger.put(new, new.indices, version=2, incarnation="b")
    ledger.evict_stale(curr_version=3, max_age=1)  # age 3 > 1: evicted; age 1 kept
    assert ledger.lose_buffer() == 1


def test_bookkeeping_runs_in_prompt_order() -> None:
    ledger = PromptLedger(seed=0, prompts_per_call=1, batch_groups=None)
    a, b, c = claim(ledger), claim(ledger), claim(ledger)
    done: list[int] = []
    ledger.put(b, b.indices, version=0, incarnation="x")
    ledger.in_order(b, lambda: done.append(1))
    assert done == []  # call 0 is still being generated
    ledger.put(a, a.indices, version=0, incarnation="x")
    ledger.in_order(a, lambda: done.append(0))
    assert done == [0, 1]
    ledger.put(c, c.indices, version=0, incarnation="x")
    ledger.in_order(c, lambda: done.append(2))
    assert done == [0, 1, 2]


def test_bookkeeping_waiting_survives_its_call_drawn_again() -> None:
    # The later call's groups reach the buffer first, their bookkeeping waits for the
    # earlier call, and the buffer dies: the redrawn call is `recorded`, and the episodes
    # first generated still enter the window once (they once were lost, not counted).
    ledger = PromptLedger(seed=0, prompts_per_call=1, batch_groups=None)
    a, b = claim(ledger), claim(ledger)
    done: list[int] = []
    ledger.put(b, b.indices, version=0, incarnation="x")
    ledger.in_order(b, lambda: done.append(1))
    assert ledger.lose_buffer() == 1
    again = claim(ledger)
    assert again.indices == b.indices
    assert again.recorded
    ledger.put(again, again.indices, version=0, incarnation="y")
    ledger.in_order(again, lambda: done.append(-1))
    assert done == []  # call 0 is still being generated
    ledger.put(a, a.indices, version=0, incarnation="y")
    ledger.in_order(a, lambda: done.append(0))
    assert done == [0, 1]


def test_frozen_hands_out_nothing() -> None:
    ledger = PromptLedger(seed=0, prompts_per_call=1, batch_groups=None)
    ledger.frozen = True
    assert ledger.claim(0) is None
    ledger.frozen = False
    assert claim(ledger).indices == (0,)


def test_a_call_restricted_keeps_its_seed_and_tasks_in_step() -> None:
    tasks = (Task("repeat", 1), Task("repeat", 2), Task("pattern", 3))
    call = Call((4, 5, 6), seed=9, version=None, tasks=tasks)
    part = call.only([6, 4])
    assert (part.indices, part.tasks, part.seed) == ((4, 6), (tasks[0], tasks[2]), 9)
    state = LedgerState(0, (part,), (Held(part, 1),), 0, 0)
    assert state.redo[0].tasks == part.tasks


def test_lost_episode_bound_by_hand() -> None:
    cfg = tiny()  # batch 128, capacity 1024, 2 loops x 8 prompts x 16 samples in flight
    cfg.checkpoint.every = 50
    held = 1024 + 2 * 8 * 16
    assert episodes_lost_bound(cfg, buffer_deaths=1, trainer_deaths=0) == held
    # A trainer death: up to 99 steps' batches since the newest complete checkpoint.
    assert episodes_lost_bound(cfg, buffer_deaths=0, trainer_deaths=1) == 99 * 128 + held
    assert episodes_lost_bound(cfg, buffer_deaths=3, trainer_deaths=2) == 5 * held + 2 * 99 * 128


def test_a_batch_taken_and_not_trained_yet_still_counts_as_held() -> None:
    # Async mode queues the next step's batch at the trainer while a step computes: its
    # groups left the buffer but are not trained, and a step's row must still count them.
    ledger = PromptLedger(seed=0, prompts_per_call=2, batch_groups=None)
    a, b = claim(ledger), claim(ledger)
    ledger.put(a, a.indices, version=0, incarnation="b")
    ledger.put(b, b.indices, version=0, incarnation="b")
    assert (ledger.held(), ledger.outstanding()) == (4, 4)
    ledger.batch_taken([0, 1])  # the step computing
    ledger.batch_taken([2, 3])  # the step queued behind it
    assert (ledger.held(), ledger.outstanding()) == (4, 0)
    ledger.trained([0, 1])
    assert ledger.held() == 2
    ledger.trained([2, 3])
    assert ledger.held() == 0
