"""The rollout bodies: what one call of prompts becomes on its way to the replay buffer.

    prompts (`--data`):     prompts -> `group_size` responses each (one generator replica,
                            one policy version) -> rewards -> advantages -> the buffer
    environments (`--env`): tasks -> `group_size` whole multi-turn episodes each, played
                            against the environment services -> advantages per episode or
                            per turn -> the buffer

Both end in `put_episodes`: the buffer takes whole groups (a group's id is its prompt's
index in the run), the ledger learns where they are, and the metrics record them in prompt
order. `make_rollout` picks the body a job uses.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from replay_buffer import Episode, EpisodeBatch

from async_grpo import tracing
from async_grpo.actors.buffer import BufferActor
from async_grpo.actors.dataset import DatasetActor
from async_grpo.actors.generator import Generator
from async_grpo.actors.reward import RewardActor
from async_grpo.config.schema import RunConfig
from async_grpo.controller.broadcast import WeightBroadcast
from async_grpo.controller.context import Job
from async_grpo.controller.ledger import Call, PromptLedger
from async_grpo.controller.play import make_encode, play_tasks
from async_grpo.controller.prefetch import PromptPrefetch
from async_grpo.controller.send_order import SendOrder
from async_grpo.generation.episodes import (
    drop_uniform_groups,
    records_to_episodes,
    to_episodes,
)
from async_grpo.generation.multiturn import Encode
from async_grpo.launch.spawn import Components
from async_grpo.model.policy import load_tokenizer
from async_grpo.observability.metrics import RunMetrics
from async_grpo.tasks.prompts import Sample

Rollout = Callable[[Call], Awaitable[int]]
"""One rollout of a call's prompts into the buffer; returns the episodes put there."""


class RolloutParts(Protocol):
    """What a rollout uses of its job (the controller's `Job` has all of it): the config, the
    processes, the prompt ledger, the metrics and the newest weights."""

    cfg: RunConfig
    components: Components
    ledger: PromptLedger
    metrics: RunMetrics
    weights: WeightBroadcast


def make_rollout(job: Job) -> Rollout:
    """The job's rollout body: whole episodes against its environments with `--env.tasks`,
    else one response per episode to its prompts."""
    if job.tasks is None:

        async def dataset(indices: list[int]) -> list[Sample]:
            return await job.components.dataset.endpoint(DatasetActor.samples).route(indices)

        # The prompts of as many calls ahead as there are rollout loops, asked for four
        # times that many at once (one question to the dataset every few steps).
        ahead = job.cfg.generator.prompts_per_call * job.cfg.rollout_loops
        prefetch = PromptPrefetch(dataset, ahead, chunk=4 * ahead)
        order = SendOrder()
        return lambda call: rollout_prompts(job, call, prefetch, order)
    encode = make_encode(load_tokenizer(job.prep.model_path))
    return lambda call: rollout_env(job, call, encode)


async def rollout_prompts(
    job: RolloutParts,
    call: Call,
    prefetch: PromptPrefetch | None = None,
    order: SendOrder | None = None,
) -> int:
    """One rollout: prompts -> a group of responses per prompt -> rewards -> advantages ->
    the replay buffer. Returns the episodes put there. With `prefetch`, the prompts usually
    came from the dataset while the call before sampled; with `order`, the generation
    request leaves after those of the calls claimed before this one (`send_order.py`)."""
    c, cfg = job.components, job.cfg
    if order is not None:
        order.claimed(call)  # before any await: the rollout loop has just claimed it
    try:
        # Prompts and their targets, by index in the run's prompt stream.
        with tracing.span("prompts", track="rollout"):
            if prefetch is None:
                indices = list(call.indices)
                samples = await c.dataset.endpoint(DatasetActor.samples).route(indices)
            else:
                samples = await prefetch.samples(call.indices, job.ledger.next_index)
        if order is not None:
            await order.turn(call)
    finally:
        if order is not None:
            # The next call's turn comes once this coroutine yields, and the request below
            # is handed to the service before it does (`route` submits it synchronously).
            order.done(call)
    # group_size responses per prompt, all from one replica and one policy version (the
    # newest weights or newer), drawn with the call's seed.
    with tracing.span("generate", track="rollout", prompts=len(samples)):
        groups = await c.generator.endpoint(Generator.generate).route(
            [s.prompt for s in samples], call.seed, job.weights.newest
        )
    # Rewards for every response.
    completions = [comp for group in groups for comp in group]
    targets = [s.target for s, group in zip(samples, groups, strict=True) for _ in group]
    with tracing.span("reward", track="rollout", responses=len(completions)):
        rewards = await c.reward.endpoint(RewardActor.score).route(
            [comp.text for comp in completions], targets
        )
    # Advantages relative to the other answers to the same prompt; `put` waits while the
    # buffer is full.
    episodes = to_episodes(groups, rewards, iter(call.indices), scale=cfg.trainer.advantage_scale)
    bookkeeping = lambda: job.metrics.record_episodes(completions, targets, rewards)  # noqa: E731
    return await put_episodes(
        job, call, call.indices, episodes, bookkeeping, generated=len(completions)
    )


async def rollout_env(job: RolloutParts, call: Call, encode: Encode) -> int:
    """One rollout: the call's tasks -> a group of whole episodes per task -> advantages ->
    the replay buffer. Returns the episodes put there."""
    cfg, tasks = job.cfg, call.tasks or ()
    with tracing.span("play", track="rollout", episodes=len(tasks) * cfg.sampling.group_size):
        groups = await play_tasks(
            job.components, cfg, encode, tasks, seed=call.seed, weights=job.weights.newest
        )
    # Advantages within each group of whole episodes; a group with a failed one is dropped
    # (and its prompt index with it: each kept group keeps its task's index as its id).
    kept = [i for i, g in zip(call.indices, groups, strict=True) if all(r.ok for r in g)]
    episodes, dropped = records_to_episodes(
        groups,
        iter(kept),
        encode,
        scale=cfg.trainer.advantage_scale,
        turn_discount=cfg.env.turn_discount if cfg.env.credit == "turn" else None,
    )
    bookkeeping = lambda: job.metrics.record_played(groups)  # noqa: E731
    played = sum(len(g) for g in groups)
    return await put_episodes(
        job, call, kept, episodes, bookkeeping, generated=played, dropped=dropped
    )


async def put_episodes(
    job: RolloutParts,
    call: Call,
    kept: Sequence[int],
    episodes: Sequence[Episode],
    bookkeeping: Callable[[], None],
    *,
    generated: int,
    dropped: int = 0,
) -> int:
    """The end of every rollout: the groups `kept` of `call` (`episodes`) into the buffer,
    the ledger told where they are, and `bookkeeping` (its episodes into the metrics) run in
    prompt order. With `buffer.drop_uniform_groups` a group whose every advantage is zero
    is dropped here instead (filtered). Counts the `generated` episodes (`dropped` of them
    in groups with a failed episode) where they went (`observability/fates.py`). Returns
    the episodes put there."""
    fates, group_size = job.metrics.fates, job.cfg.sampling.group_size
    filtered = 0
    if job.cfg.buffer.drop_uniform_groups:
        episodes, useless = drop_uniform_groups(episodes)
        filtered = len(useless) * group_size
        kept = [g for g in kept if g not in useless]
    # Read field by field: a batch made from columns (`to_episodes`) makes no `Episode`.
    batch = episodes if isinstance(episodes, EpisodeBatch) else EpisodeBatch(episodes)
    columns = batch.columns()
    tokens: dict[int, int] = {}
    for group, length in zip(batch.group_ids(), columns.response_lens.tolist(), strict=True):
        assert isinstance(group, int)
        tokens[group] = tokens.get(group, 0) + length
    incarnation = ""
    if batch:
        with tracing.span("put", track="rollout", episodes=len(batch)):
            put = job.components.buffer.endpoint(BufferActor.put)
            incarnation = await put.route(batch)
    version = min(columns.policy_version.tolist(), default=0)
    # Groups a buffer took just before it died are lost with it (and drawn again).
    # Counted with the put's booking, not before its wait for room: a row in between sees
    # neither. Groups the trainer took before this answer came were counted then.
    fates.generated += generated - job.ledger.taken_early(kept) * group_size
    fates.filtered += filtered
    job.metrics.episodes_dropped += dropped
    lost = job.ledger.put(call, kept, version, incarnation, tokens)
    job.metrics.faults.episodes_lost += lost * group_size
    job.ledger.in_order(call, bookkeeping)
    return len(batch)
