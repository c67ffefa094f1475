"""Multi-turn play for rollouts and evaluations (`--env.tasks`): whole episodes of tasks
against the environment services, every policy turn sampled by one generator replica."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from rl_envs import Task
from transformers import PreTrainedTokenizerBase

from async_grpo.actors.generator import Generator
from async_grpo.config.schema import RunConfig
from async_grpo.generation.decoding import Completion
from async_grpo.generation.multiturn import Encode, PlayedEpisode, play
from async_grpo.launch.spawn import Components
from async_grpo.seeds import derive_seed
from async_grpo.weight_sync.update import WeightUpdate


def make_encode(tokenizer: PreTrainedTokenizerBase) -> Encode:
    """The environment's text as token ids, with no special tokens: the policy's own
    end-of-sequence token already separates its turn from what follows."""

    def encode(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    return encode


async def play_tasks(
    c: Components,
    cfg: RunConfig,
    encode: Encode,
    tasks: Sequence[Task],
    *,
    seed: int,
    weights: WeightUpdate | None,
) -> list[list[PlayedEpisode]]:
    """`group_size` whole episodes of each task against its environment service (a rollout's
    or an evaluation's)."""
    # One generator replica (a sticky session) samples every turn of this play; each round
    # of turns has its own seed, derived from the play's.
    rounds = itertools.count()
    async with c.generator.session() as generator:
        route = generator.endpoint(Generator.continue_turns).route

        async def turns(contexts: list[list[int]]) -> list[Completion]:
            return await route(contexts, derive_seed(seed, next(rounds)), weights)

        return await play(
            turns,
            encode,
            c.envs,
            tasks,
            cfg.sampling.group_size,
            max_turns=cfg.env.max_turns,
            step_timeout_s=cfg.env.step_timeout_s,
        )
