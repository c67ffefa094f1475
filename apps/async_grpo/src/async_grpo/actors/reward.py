"""The reward actor: scores responses against targets with the configured functions."""

from __future__ import annotations

from monarch.actor import Actor, endpoint

from async_grpo import tracing
from async_grpo.actors.cores import ProcessSetup, settle_heap, share_cores
from async_grpo.tasks.math_reward import MathWorker
from async_grpo.tasks.rewards import REWARDS, combined, parse_weights


class RewardActor(Actor):
    """`fns` is a spec like "count" or "numeric:0.9,format:0.1" (see `rewards.parse_weights`)."""

    def __init__(self, fns: str, setup: ProcessSetup | None = None) -> None:
        share_cores(setup, "reward")
        tracing.start_from_env("reward")
        weights = parse_weights(fns)
        table = dict(REWARDS)
        if "math" in weights:
            # Endpoints run off the main thread, where math-verify's timeouts (signals)
            # cannot: its checks run in a child process whose main thread they can.
            table["math"] = MathWorker()
        self._score = combined(weights, table)
        settle_heap()

    @endpoint
    async def score(self, responses: list[str], targets: list[str]) -> list[float]:
        if len(responses) != len(targets):
            raise ValueError(f"{len(responses)} responses but {len(targets)} targets")
        with tracing.span("score", responses=len(responses)):
            return [self._score(r, t) for r, t in zip(responses, targets, strict=True)]
