"""Driving one whole episode: a policy and an environment take turns until `done`.

    async def policy(conversation: Sequence[Segment[Gen]]) -> PolicyTurn[Gen]:
        ...  # generate the next turn from the conversation so far
        return PolicyTurn(text, payload)

    record = await run_episode(policy, env, Task("repeat", seed=7))
    if record.ok:
        train_on(record)           # record.segments, record.reward
    else:
        dropped[record.error.kind] += 1

The contract with the policy: it is an async callable that gets the conversation so far
(every segment, in order; the first is the environment's first observation) and returns
its turn: the `text` the environment will read, and a `payload` the package never looks
at. An LLM app puts there what its trainer needs from that turn: the token ids it sampled
and their log-probabilities, the policy version. The environment's segments keep their text
only; the app tokenizes them (`rl_envs.tokens` joins both into one sequence with a loss mask).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, Protocol, TypeVar

from actor_service import NoHealthyReplicaError, ReplicaDiedError, ServiceClosedError
from monarch.actor import ActorError

from rl_envs._checks import check_int
from rl_envs.environment import Environment
from rl_envs.errors import EpisodeLostError
from rl_envs.service import EnvironmentService
from rl_envs.types import Action, Observation, StepResult, Task

P = TypeVar("P")
R = TypeVar("R")

Source = Literal["environment", "policy"]
"""Who produced a segment: the environment (context for the policy, never trained on) or
the policy (its actions: trained on, with behaviour log-probs in the payload)."""


@dataclass(frozen=True)
class PolicyTurn(Generic[P]):
    """What a policy returns for one turn: the text the environment reads, and an opaque
    payload kept with it in the record (e.g. token ids and log-probs)."""

    text: str
    payload: P


@dataclass(frozen=True)
class Segment(Generic[P]):
    """One piece of an episode's conversation, in order.

    Attributes:
        source: `"environment"` or `"policy"`.
        text: what was said. An environment segment's text is its observation's text.
        payload: a policy segment's payload as the policy returned it; None for the
            environment.
        reward: for a policy segment, the reward the environment gave that action; 0.0 for
            the environment.
    """

    source: Source
    text: str
    payload: P | None = None
    reward: float = 0.0


ErrorKind = Literal["replica_died", "environment_error", "timeout"]
"""Why an episode failed: the replica holding it died (mid-step, or between steps so that
its replacement does not know it); the environment's own code raised; or a reset or step
took longer than `step_timeout_s`."""


@dataclass(frozen=True)
class EpisodeError:
    """Why an episode was dropped: `kind`, a one-line `message`, and `turns`, the policy
    turns that had been answered when it failed."""

    kind: ErrorKind
    message: str
    turns: int


@dataclass(frozen=True)
class EpisodeRecord(Generic[P]):
    """One episode, whole, or the note that it failed.

    A completed episode (`error is None`) holds every segment: the environment's first
    observation, then each policy turn followed by the environment's answer (an answer with
    empty text is left out). A failed episode holds no segments at all, so nothing of it
    can be trained on by mistake: drop it and count it by `error.kind`.

    Attributes:
        task: the task played.
        segments: the conversation (empty when failed).
        done: the environment ended the episode; False when it was cut at `max_turns`
            (or failed).
        error: why it failed, or None.
    """

    task: Task
    segments: tuple[Segment[P], ...] = ()
    done: bool = False
    error: EpisodeError | None = None

    def __post_init__(self) -> None:
        if self.error is not None and (self.segments or self.done):
            raise ValueError("a failed EpisodeRecord holds no segments and is not done")
        if self.error is None and (not self.segments or self.segments[0].source != "environment"):
            raise ValueError("an EpisodeRecord starts with the environment's first observation")

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def rewards(self) -> tuple[float, ...]:
        """One reward per policy turn."""
        return tuple(s.reward for s in self.segments if s.source == "policy")

    @property
    def reward(self) -> float:
        """The episode's return: the sum of its rewards (0.0 when failed)."""
        return sum(self.rewards)

    @property
    def turns(self) -> int:
        """Policy turns in the episode."""
        return len(self.rewards)


Policy = Callable[[Sequence[Segment[P]]], Awaitable[PolicyTurn[P]]]
"""An async callable: the conversation so far -> the policy's next turn."""


class _Episode(Protocol):
    async def reset(self, task: Task) -> Observation: ...
    async def step(self, action: Action) -> StepResult: ...


class _Failed(Exception):
    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind


async def run_episode(
    policy: Policy[P],
    env: EnvironmentService | Environment,
    task: Task,
    *,
    max_turns: int = 32,
    step_timeout_s: float | None = None,
) -> EpisodeRecord[P]:
    """Plays `task` on `env` until the environment says `done` (or `max_turns` policy
    turns), and returns the whole episode, or a failed record if the environment failed.

    On a service the episode runs in one sticky session, so every step reaches the replica
    that holds it; a replica that dies mid-episode (`ReplicaDiedError`, `EpisodeLostError`,
    no healthy replica), an environment whose code raises, and a reset or step slower than
    `step_timeout_s` all give a record with `error` set and no segments. An error of the
    policy's own propagates (after the episode is closed). A local `Environment` instance
    is reset and used directly (one episode at a time per instance).
    """
    if not isinstance(task, Task):
        raise TypeError(f"task must be a rl_envs.Task, got {type(task).__name__}")
    if not isinstance(env, EnvironmentService | Environment):
        raise TypeError(
            f"env must be an EnvironmentService or an Environment, got {type(env).__name__}"
        )
    if task.env != env.name:
        raise ValueError(f"a task for environment {task.env!r} was given to {env.name!r}")
    check_int("max_turns", max_turns, 1)
    if step_timeout_s is not None and not step_timeout_s > 0:
        raise ValueError(f"step_timeout_s must be > 0 or None, got {step_timeout_s!r}")

    segments: list[Segment[P]] = []
    turns = 0
    try:
        async with _open(env) as episode:
            observation = await _call(episode.reset(task), step_timeout_s)
            segments.append(Segment("environment", observation.text))
            done = False
            while not done and turns < max_turns:
                turn: object = await policy(tuple(segments))
                if not (isinstance(turn, PolicyTurn) and isinstance(turn.text, str)):
                    raise TypeError(
                        f"a policy must return PolicyTurn(text: str, payload), got {turn!r:.200}"
                    )
                result = await _call(episode.step(Action(turn.text)), step_timeout_s)
                turns += 1
                segments.append(Segment("policy", turn.text, turn.payload, result.reward))
                if result.observation.text:
                    segments.append(Segment("environment", result.observation.text))
                done = result.done
    except _Failed as failure:
        return EpisodeRecord(task, error=EpisodeError(failure.kind, str(failure), turns))
    return EpisodeRecord(task, tuple(segments), done)


@contextlib.asynccontextmanager
async def _open(env: EnvironmentService | Environment) -> AsyncIterator[_Episode]:
    if isinstance(env, Environment):
        try:
            yield env
        finally:
            await env.close()
    else:
        async with env.episode() as episode:
            yield episode


async def _call(call: Awaitable[R], limit_s: float | None) -> R:
    """Awaits an environment call, turning its failures into `_Failed`."""
    try:
        return await asyncio.wait_for(call, limit_s)
    except TimeoutError:
        raise _Failed("timeout", f"the environment did not answer within {limit_s} s") from None
    except (ReplicaDiedError, NoHealthyReplicaError) as e:
        raise _Failed("replica_died", f"{type(e).__name__}: {e}") from None
    except ActorError as e:
        cause = e.exception
        if isinstance(cause, EpisodeLostError):
            raise _Failed("replica_died", str(cause)) from None
        raise _Failed("environment_error", f"{type(cause).__name__}: {cause}") from None
    except ServiceClosedError:
        raise  # the app shut the service down: not this episode's failure
    except Exception as e:
        raise _Failed("environment_error", f"{type(e).__name__}: {e}") from None
