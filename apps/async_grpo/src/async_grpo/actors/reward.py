"""The reward actor: scores responses against targets with the configured functions."""

from __future__ import annotations

from monarch.actor import Actor, endpoint

from async_grpo import tracing
from async_grpo.tasks.rewards import combined, parse_weights


class RewardActor(Actor):
    """`fns` is a spec like "count" or "numeric:0.9,format:0.1" (see `rewards.parse_weights`)."""

    def __init__(self, fns: str) -> None:
        tracing.start_from_env("reward")
        self._score = combined(parse_weights(fns))

    @endpoint
    async def score(self, responses: list[str], targets: list[str]) -> list[float]:
        if len(responses) != len(targets):
            raise ValueError(f"{len(responses)} responses but {len(targets)} targets")
        with tracing.span("score", responses=len(responses)):
            return [self._score(r, t) for r, t in zip(responses, targets, strict=True)]
