"""Multi-turn rollouts: whole episodes against environment services, generated turn by turn.

A GRPO group is `group_size` episodes of one task. All the episodes of a rollout call are
played at once with `rl_envs.run_episode`, and they share one policy, a `TurnBatcher`:
each episode asks it for its next turn with the conversation so far, and once every
episode still running has asked, one `continue_turns` request to a generator replica
samples all of those turns in one batch. An episode that ends (or fails) stops counting,
so the others never wait for it.

The conversation the model sees is token ids: the environment's text encoded, the
policy's turns exactly as sampled (with their end-of-sequence token), joined in order
(`rl_envs.context_ids`). Training uses the same join (`episodes.records_to_episodes`), so
what was generated and what is trained agree token for token.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence

from rl_envs import (
    EnvironmentService,
    EpisodeRecord,
    PolicyTurn,
    Segment,
    Task,
    context_ids,
    run_episode,
)

from async_grpo.generation.decoding import Completion

Encode = Callable[[str], list[int]]
"""Environment text -> token ids (no special tokens added)."""

Generate = Callable[[list[list[int]]], Awaitable[list[Completion]]]
"""Contexts (token ids) -> one sampled turn each, in order (`Generator.continue_turns`)."""

PlayedEpisode = EpisodeRecord[Completion]
"""An episode whose policy turns carry the `Completion` that sampled them."""


def turn_ids(turn: Completion) -> list[int]:
    return turn.response_ids


def turn_logprobs(turn: Completion) -> list[float]:
    return turn.behavior_logprobs


class TurnBatcher:
    """The policy of many concurrent episodes: their turns are sampled in batches.

    `episodes` is how many episodes will call it; each calls `finished()` once when it
    ends, however it ends. A batch goes out when every episode still running is waiting
    for its turn, so no request waits on an episode that will never ask again.
    """

    def __init__(self, generate: Generate, encode: Encode, episodes: int) -> None:
        self._generate = generate
        self._encode = encode
        self._live = episodes
        self._pending: list[tuple[list[int], asyncio.Future[Completion]]] = []
        self._flights: set[asyncio.Task[None]] = set()
        self.batches = 0
        """Generate requests sent so far."""

    async def __call__(self, conversation: Sequence[Segment[Completion]]) -> PolicyTurn[Completion]:
        ids = context_ids(conversation, encode=self._encode, token_ids=turn_ids)
        future: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        self._pending.append((ids, future))
        self._flush_if_ready()
        turn = await future
        return PolicyTurn(turn.text, turn)

    def finished(self) -> None:
        """One episode is over: the others no longer wait for it."""
        self._live -= 1
        self._flush_if_ready()

    def close(self) -> None:
        """Cancels requests in flight (the episodes were cancelled)."""
        for flight in self._flights:
            flight.cancel()
        for _, future in self._pending:
            future.cancel()

    def _flush_if_ready(self) -> None:
        if self._pending and len(self._pending) >= self._live:
            batch, self._pending = self._pending, []
            self.batches += 1
            flight = asyncio.create_task(self._answer(batch))
            self._flights.add(flight)
            flight.add_done_callback(self._flights.discard)

    async def _answer(self, batch: list[tuple[list[int], asyncio.Future[Completion]]]) -> None:
        futures = [future for _, future in batch]
        try:
            turns = await self._generate([ids for ids, _ in batch])
            if len(turns) != len(batch):
                raise RuntimeError(f"asked for {len(batch)} turns, got {len(turns)}")
        except asyncio.CancelledError:
            for future in futures:
                future.cancel()
            raise
        except Exception as e:  # every episode of the batch sees the generator's failure
            for future in futures:
                if not future.done():
                    future.set_exception(e)
            return
        for future, turn in zip(futures, turns, strict=True):
            if not future.done():
                future.set_result(turn)


async def play(
    generate: Generate,
    encode: Encode,
    envs: Mapping[str, EnvironmentService],
    tasks: Sequence[Task],
    group_size: int,
    *,
    max_turns: int,
    step_timeout_s: float,
) -> list[list[PlayedEpisode]]:
    """Plays every task `group_size` times, all episodes at once; returns one group of
    records per task, in order. A failed episode is a record with `error` set (see
    `rl_envs.run_episode`); a failure of the generator propagates after every episode
    has been stopped."""
    batcher = TurnBatcher(generate, encode, len(tasks) * group_size)

    async def one(task: Task) -> PlayedEpisode:
        try:
            return await run_episode(
                batcher, envs[task.env], task, max_turns=max_turns, step_timeout_s=step_timeout_s
            )
        finally:
            batcher.finished()

    running = [asyncio.ensure_future(one(t)) for t in tasks for _ in range(group_size)]
    try:
        records = await asyncio.gather(*running)
    except BaseException:
        for episode in running:
            episode.cancel()
        batcher.close()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*running, return_exceptions=True)
        raise
    g = group_size
    return [list(records[k * g : (k + 1) * g]) for k in range(len(tasks))]


def policy_version(record: PlayedEpisode) -> int:
    """The oldest weight version that sampled a turn of `record` (its staleness is
    counted from there)."""
    return min(s.payload.policy_version for s in record.segments if s.payload is not None)


def policy_text(record: PlayedEpisode) -> str:
    """The policy's turns of an episode, joined with " | " (for reports)."""
    return " | ".join(s.text for s in record.segments if s.source == "policy")
