"""The controller's ledger of prompts: which ones the run drew, and where each one is.

A rollout claims a `Call`: prompts, by index in the run's prompt stream (`tasks/prompts.py`),
generated together with one seed. Each prompt's group then goes in flight -> held (in the
buffer) -> taken (in a batch) -> trained, or leaves as stale (the buffer evicted it) or
dropped (an episode of its group failed). Knowing that is what lets a failure cost no
prompt and train none twice (`docs/09_fault_tolerance.md`):

- a checkpoint saves the position (`next_index`), the groups the buffer holds, and as
  calls to draw again the prompts in flight at the cut (and those taken but not trained,
  after an interrupt);
- a buffer that dies loses what it held: `lose_buffer` queues those prompts again (a put
  that answers after the death, from the dead buffer, is queued again too);
- in sync mode (`batch_groups` set) the ledger hands out exactly one batch of prompts per
  version, each for the weights of that version: prompt indices, seeds and versions are
  then the same in every run with the same seed, which is what makes a sync run repeat.

Pure Python, no Monarch: the controller calls it from one event loop.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence

from rl_envs import Task

from async_grpo.seeds import derive_seed

Draw = Callable[[int], Sequence[Task]]
"""Multi-turn: draws the tasks of `n` new prompts (`environments.TaskSource.draw`)."""


@dataclasses.dataclass(frozen=True)
class Call:
    """Prompts generated together in one request.

    `indices`: their positions in the run's prompt stream, which are also their groups' ids
    in the buffer. `seed`: the seed their samples are drawn with (derived from the run's
    seed and the first index, so a call drawn again samples the same). `version`: in sync
    mode, the weights they must be sampled with (the batch they fill); None in async mode.
    `tasks`: multi-turn, the environment task of each index; None for prompts. `recorded`:
    their episodes are already in the metrics (a call generated again after the buffer
    holding them died): the new ones replace the lost ones, they are not counted twice."""

    indices: tuple[int, ...]
    seed: int
    version: int | None = None
    tasks: tuple[Task, ...] | None = None
    recorded: bool = False

    def only(self, indices: Iterable[int]) -> Call:
        """The same call restricted to `indices` (in this call's order)."""
        keep = set(indices)
        picked = [k for k, i in enumerate(self.indices) if i in keep]
        tasks = None if self.tasks is None else tuple(self.tasks[k] for k in picked)
        return dataclasses.replace(
            self, indices=tuple(self.indices[k] for k in picked), tasks=tasks
        )


@dataclasses.dataclass(frozen=True)
class Held:
    """Groups of one call the buffer holds: `call` restricted to them, and the oldest policy
    version among them (what the buffer's staleness rule reads)."""

    call: Call
    version: int


@dataclasses.dataclass(frozen=True)
class Stale:
    """A held group the buffer evicted as too stale: how many versions behind it was, and
    its response tokens."""

    age: int
    tokens: int


@dataclasses.dataclass(frozen=True)
class LedgerState:
    """The ledger at a checkpoint's cut: the next new prompt index, the calls to generate
    before any new one, the groups in the buffer, and (sync mode) the version whose batch is
    being filled and how many of its groups were handed out."""

    next_index: int
    redo: tuple[Call, ...]
    held: tuple[Held, ...]
    open_version: int
    used: int
    tokens: tuple[tuple[int, int], ...] = ()
    """Response tokens of each held group, as (group, tokens)."""


class PromptLedger:
    """Hands out calls and follows each prompt's group until it is trained.

    `prompts_per_call`: prompts in a new call. `batch_groups`: sync mode, the groups of one
    batch (each version's prompts fill exactly one); None: async mode, no quota."""

    def __init__(self, seed: int, prompts_per_call: int, batch_groups: int | None) -> None:
        self._seed, self._per_call, self._quota = seed, prompts_per_call, batch_groups
        self.next_index = 0
        self.frozen = False
        self._redo: collections.deque[Call] = collections.deque()
        self._in_flight: dict[int, Call] = {}  # by first index
        self._held: dict[int, Held] = {}  # by group (prompt index)
        self._taken: dict[int, Call] = {}  # by group: in a batch, not yet trained
        # Groups the trainer took before their put's answer was booked (the buffer answers
        # the put and the sample separately): their late put must not hold them again.
        self._early: set[int] = set()
        self._seen: set[str] = set()  # buffer incarnations that answered a put
        self._dead: set[str] = set()  # those that died since
        self._open_version, self._used = 0, 0
        self._after: dict[int, Callable[[], None]] = {}  # bookkeeping waiting its turn
        self._tokens: dict[int, int] = {}  # response tokens of each held group
        self.lost_groups = 0

    # ------------------------------------------------------------------ rollouts

    @property
    def sync(self) -> bool:
        """Sync mode: each version's prompts fill exactly one batch."""
        return self._quota is not None

    def outstanding(self) -> int:
        """Groups claimed and not yet trained or gone: in flight in a rollout, or held in
        the buffer (what the staleness gate's admission window counts)."""
        flying = sum(
            1 for call in self._in_flight.values() for i in call.indices if i not in self._early
        )
        return flying + len(self._held)

    def held(self) -> int:
        """Groups in the buffer, or taken in a batch and not trained yet (on their way to the
        trainer, or queued there behind the step it is computing)."""
        return len(self._held) + len(self._taken)

    def claim(
        self, generators: int, draw: Draw | None = None, limit: int | None = None
    ) -> Call | None:
        """The next call for generators running version `generators`, or None for now (the
        ledger is frozen for a checkpoint, in sync mode this version's batch is handed out,
        or `limit`, the groups the call may have, is 0). Calls to draw again come first (cut
        to `limit`, the rest kept for later)."""
        if self.frozen or (limit is not None and limit <= 0):
            return None
        if self._redo and (self._redo[0].version or 0) <= generators:
            call = self._redo.popleft()
            if limit is not None and len(call.indices) > limit:
                self._redo.appendleft(call.only(call.indices[limit:]))
                call = call.only(call.indices[:limit])
            return self._start(call)
        count = self._per_call if limit is None else min(self._per_call, limit)
        version = None
        if self._quota is not None:
            if generators > self._open_version:
                self._open_version, self._used = generators, 0
            count = min(count, self._quota - self._used)
            if count <= 0:
                return None
            self._used += count
            version = self._open_version
        first = self.next_index
        self.next_index += count
        tasks = tuple(draw(count)) if draw is not None else None
        seed = derive_seed(self._seed, "call", first)
        return self._start(Call(tuple(range(first, first + count)), seed, version, tasks))

    def put(
        self,
        call: Call,
        kept: Sequence[int],
        version: int,
        incarnation: str,
        tokens: Mapping[int, int] | None = None,
    ) -> int:
        """`call`'s rollout put the groups `kept` into the buffer `incarnation` (the others
        were dropped), all sampled from `version` or newer, with `tokens` response tokens
        per group. Returns the groups lost: all of `kept` when that buffer has died since
        (they are drawn again), else 0."""
        self._in_flight.pop(call.indices[0], None)
        if self._quota is not None and call.version == self._open_version:
            self._used -= len(call.indices) - len(kept)  # dropped groups are replaced
        kept = [g for g in kept if g not in self._early]
        self._early.difference_update(call.indices)
        if not kept:
            return 0
        self._seen.add(incarnation)
        if incarnation in self._dead:  # that buffer died after taking them
            self._queue(dataclasses.replace(call.only(kept), recorded=True))
            self.lost_groups += len(kept)
            return len(kept)
        held = Held(call.only(kept), version)
        for index in kept:
            self._held[index] = held
            self._tokens[index] = (tokens or {}).get(index, 0)
        return 0

    def in_order(self, call: Call, action: Callable[[], None]) -> None:
        """Runs `action`, a finished call's bookkeeping (its episodes into the reward
        window), in the order of the calls' prompts rather than the order rollouts happen
        to finish: once no call with smaller prompt indices is still being generated. In
        sync mode that makes the window, like everything trained, the same in every run
        with the same seed. A `recorded` call's bookkeeping is skipped: its first rollout's
        is done, or still waiting here under the same key, and must not be replaced."""
        if call.recorded:
            self._after.setdefault(call.indices[0], lambda: None)
        else:
            self._after[call.indices[0]] = action
        first = min(self._in_flight, default=None)
        for key in sorted(self._after):
            if first is not None and key > first:
                break
            self._after.pop(key)()

    # ------------------------------------------------------------------ the trainer

    def take(self, groups: Iterable[int]) -> int:
        """The trainer took these groups in a batch (possibly before their put's answer
        was booked: the buffer answers the put and the sample separately). Returns how
        many of them were taken before their put was booked."""
        early = 0
        for group in groups:
            held = self._held.pop(group, None)
            self._tokens.pop(group, None)
            if held is not None:
                self._taken[group] = held.call
                continue
            flying = self._flying(group)
            if flying is not None:
                self._early.add(group)
                self._taken[group] = flying
                early += 1
        return early

    def batch_taken(self, groups: Iterable[int]) -> int:
        """The trainer took a batch of these groups (`take`); returns how many it took
        before their put was booked."""
        return self.take(groups)

    def taken_early(self, groups: Iterable[int]) -> int:
        """How many of `groups` (a put's, about to be booked) the trainer already took."""
        return sum(1 for g in groups if g in self._early)

    def untrained(self, groups: Iterable[int]) -> None:
        """The run stopped with a batch of these groups on its way: they, and any group taken
        but never trained, are drawn again (`take`, then `untake`)."""
        self.take(groups)
        self.untake()

    def trained(self, groups: Iterable[int]) -> None:
        """A train step consumed these groups."""
        for group in groups:
            self._taken.pop(group, None)

    def untake(self) -> None:
        """Groups taken but never trained (the run stopped between the two) are drawn
        again."""
        for call in _calls_of(self._taken):
            self._queue(call)
        self._taken.clear()

    def evict_stale(self, curr_version: int, max_age: int) -> list[Stale]:
        """Forgets held groups older than the buffer keeps for `curr_version` (it evicts them
        at the same request, by the same rule) and returns them."""
        stale = [g for g, h in self._held.items() if curr_version - h.version > max_age]
        gone = []
        for group in stale:
            held = self._held.pop(group)
            gone.append(Stale(curr_version - held.version, self._tokens.pop(group, 0)))
        return gone

    # ------------------------------------------------------------------ failures

    def lose_buffer(self) -> int:
        """The buffer died: everything it held is drawn again, and so is a put answered by
        it (or any buffer before it) that arrives later. Returns the groups lost."""
        self._dead.update(self._seen)
        lost = len(self._held)
        for call in _calls_of({g: h.call for g, h in self._held.items()}):
            self._queue(dataclasses.replace(call, recorded=True))
        self._held.clear()
        self._tokens.clear()
        self.lost_groups += lost
        return lost

    # ------------------------------------------------------------------ checkpoints

    def state(self, in_buffer: Mapping[int, int]) -> LedgerState:
        """The ledger at a cut, given the groups the buffer's saved state holds (group id ->
        policy version; taken with the ledger frozen and no batch outstanding). A call in
        flight whose groups are not in that state is drawn again after a resume, and so are
        groups taken but not trained, and held groups absent there: their put reached the
        buffer after its snapshot (the ledger forgets stale groups itself, `evict_stale`)."""
        redo = list(self._redo)
        held: list[Held] = []
        for flying in self._in_flight.values():
            # Groups taken before their put answered are accounted for by `_taken`.
            call = flying.only(i for i in flying.indices if i not in self._early)
            if not call.indices:
                continue
            landed = [i for i in call.indices if i in in_buffer]
            if landed:
                held.append(Held(call.only(landed), min(in_buffer[i] for i in landed)))
            if len(landed) < len(call.indices):
                redo.append(call.only(i for i in call.indices if i not in in_buffer))
        still = {g: h.call for g, h in self._held.items() if g in in_buffer}
        held += [Held(c, min(in_buffer[i] for i in c.indices)) for c in _calls_of(still)]
        late = {g: h.call for g, h in self._held.items() if g not in in_buffer}
        return LedgerState(
            next_index=self.next_index,
            redo=tuple(redo + _calls_of(late) + _calls_of(self._taken)),
            held=tuple(held),
            open_version=self._open_version,
            used=self._used,
            tokens=tuple((g, self._tokens.get(g, 0)) for h in held for g in h.call.indices),
        )

    def load(self, state: LedgerState) -> None:
        """Replaces everything with `state` (nothing in flight, nothing taken)."""
        self.next_index = state.next_index
        self._redo = collections.deque(state.redo)
        self._in_flight, self._taken, self._after = {}, {}, {}
        self._early = set()
        self._held = {i: h for h in state.held for i in h.call.indices}
        self._tokens = dict(state.tokens)
        self._open_version, self._used = state.open_version, state.used

    # ------------------------------------------------------------------ internals

    def _start(self, call: Call) -> Call:
        self._in_flight[call.indices[0]] = call
        return call

    def _flying(self, group: int) -> Call | None:
        """The call in flight that holds `group`, if any."""
        for call in self._in_flight.values():
            if group in call.indices:
                return call
        return None

    def _queue(self, call: Call) -> None:
        if call.indices:
            self._redo.append(call)


def _calls_of(groups: Mapping[int, Call]) -> list[Call]:
    """The calls these groups came from, each restricted to them, in index order."""
    members: dict[int, list[int]] = {}
    calls: dict[int, Call] = {}
    for group, call in groups.items():
        members.setdefault(call.indices[0], []).append(group)
        calls[call.indices[0]] = call
    return [calls[first].only(members[first]) for first in sorted(members)]
