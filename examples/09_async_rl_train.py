"""Example 09: the whole async RL loop on a tiny model, generation and training at once.

What it teaches
    A random-init 2-layer Qwen2 learns by GRPO to answer `count to N:` with `1 2 ... N`.
    Two loops run concurrently and never call each other:

      rollouts  wait for room in the buffer -> 8 prompts, half to each generator replica,
                8 answers each -> rewards -> advantages within each group -> buffer
      training  a batch no older than MAX_POLICY_AGE versions -> one GRPO step -> the
                trainer stages the new weights and returns a small manifest -> the next
                rollout request carries it, and the generator pulls before it samples

    The generators are an `actor-service` service (chapter 02), the weights move with
    `rdma-tensor` (chapter 03), the buffer is `replay-buffer`'s. Resharding (chapter 04) is
    left out: the trainer is one process. The model, sampler, rewards and GRPO math are the
    pure functions of `apps/async_grpo`, the full job (`uv run async-grpo`), whose
    `--trainer.procs 2` trains sharded and reshards to the generators.

What to look at
    Per step: the version, the batch's reward, the age of its episodes; some trajectories
    with the version that made them. At the end: the reward early and late, who waited for
    whom, and the checks: no trained episode older than the bound, every pulled version
    bit-identical to the published one, and the importance ratio 1 on fresh tokens.

Run
    uv run python examples/09_async_rl_train.py              # 80 steps: the reward rises
    uv run python examples/09_async_rl_train.py --steps 12   # a short run, as CI does
    uv run python examples/09_async_rl_train.py --max-policy-age 0   # see chapter 05
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import os
import random
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
from _checks import expect
from actor_service import Service, ServiceConfig, spawn_service
from async_grpo.config.presets import TINY_ARCH
from async_grpo.config.schema import LossConfig, SamplingConfig
from async_grpo.generation.decoding import Completion, generate
from async_grpo.generation.episodes import to_episodes
from async_grpo.grpo.batching import pack, sequence_logprobs
from async_grpo.grpo.loss import grpo_loss
from async_grpo.model.policy import load_policy, load_tokenizer, write_random_checkpoint
from async_grpo.tasks.prompts import corpus_for, count_sample
from async_grpo.tasks.rewards import count_score
from monarch.actor import Actor, endpoint, this_host
from rdma_tensor import Manifest, Publisher, Subscriber
from replay_buffer import Episode, ReplayBuffer, ReplayBufferConfig

SAMPLING = SamplingConfig(group_size=8, max_new_tokens=8, temperature=1.0, top_p=1.0)
LOSS = LossConfig(clip_eps=0.2, importance="clip")
LR, MAX_N, BATCH = 1e-3, 6, 64  # prompts "count to N:" with N <= 6; 64 episodes a step


def digest(model: torch.nn.Module) -> str:
    """sha256 of every weight's bytes: equal digests mean bit-identical weights."""
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:12]


class Generator(Actor):
    """One generator replica: samples with the weights it pulled last."""

    def __init__(self, checkpoint: str) -> None:
        torch.set_num_threads(1)  # three busy processes and this script share the cores
        self.model, self.tokenizer = load_policy(checkpoint), load_tokenizer(checkpoint)
        self.weights = Subscriber(self.model, mode="copy")  # version None: the checkpoint
        self.rng = torch.Generator().manual_seed(os.getpid())  # replicas sample differently
        self.pulls: list[tuple[int, str]] = []  # (version, digest): for the checks

    @endpoint
    async def generate(
        self, prompts: list[str], manifest: Manifest | None
    ) -> list[list[Completion]]:
        """Pulls the newest weights if `manifest` is newer (between two batches, never
        during one), then samples `group_size` answers to each prompt."""
        if manifest is not None and manifest.version > (self.weights.version or 0):
            await self.weights.pull(manifest)
            self.pulls.append((self.weights.version or 0, digest(self.model)))
        version = self.weights.version or 0
        return generate(self.model, self.tokenizer, prompts, SAMPLING, version, generator=self.rng)

    @endpoint
    async def pulled(self) -> list[tuple[int, str]]:
        return self.pulls


@dataclass(frozen=True)
class StepResult:
    """One optimizer step: the new version, its manifest (a few KB), and |log ρ| per token
    before the update: the largest over episodes of the trained version (age 0), the mean
    over older ones (None when there were none)."""

    version: int
    manifest: Manifest
    fresh_log_ratio_max: float
    stale_log_ratio_mean: float | None


class Trainer(Actor):
    """Holds the trainable policy, AdamW, and the `Publisher` that stages each version."""

    def __init__(self, checkpoint: str) -> None:
        torch.set_num_threads(1)
        self.model = load_policy(checkpoint).train(True)
        tokenizer = load_tokenizer(checkpoint)
        self.vocab, self.pad = len(tokenizer), int(tokenizer.pad_token_id or 0)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=LR)
        self.publisher = Publisher()
        self.version = 0
        self.published = {0: digest(self.model)}

    @endpoint
    async def step(self, episodes: list[Episode]) -> StepResult:
        batch = pack(episodes, self.pad)
        s = SAMPLING
        logprobs = sequence_logprobs(self.model, batch, s.temperature, s.top_p, self.vocab)
        # Each token's term is weighted by ρ against the log-prob the generator recorded.
        loss, _ = grpo_loss(
            logprobs, batch.behavior_logprobs, batch.advantages, batch.response_mask, LOSS
        )
        self.opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.version += 1
        # One copy into CPU staging and a small manifest back; no generator is waited for.
        manifest = self.publisher.publish(self.model.state_dict(), self.version)
        self.published[self.version] = digest(self.model)

        log_ratio = (logprobs.detach() - batch.behavior_logprobs).abs()
        fresh = torch.tensor([e.policy_version == self.version - 1 for e in episodes])[:, None]
        real = batch.response_mask > 0
        on, off = log_ratio[real & fresh], log_ratio[real & ~fresh]
        on_max = float(on.max()) if on.numel() else 0.0
        return StepResult(
            self.version, manifest, on_max, float(off.mean()) if off.numel() else None
        )

    @endpoint
    async def digests(self) -> dict[int, str]:
        return self.published


@dataclass
class Shared:
    """What the two loops share (one event loop, so no locks)."""

    manifest: Manifest | None = None  # the newest published weights
    done: bool = False
    trainer_idle_s: float = 0.0  # waiting for a fresh batch
    rollouts_held_s: float = 0.0  # waiting for room in the buffer
    log: list[tuple[StepResult, list[Episode]]] = field(default_factory=list)


async def rollouts(
    gens: Service[Generator], buffer: ReplayBuffer, shared: Shared, seed: int
) -> None:
    """Loop 1, generation: room -> prompts -> answers -> rewards -> buffer, until done."""
    generate_ = gens.endpoint(Generator.generate)
    rng, group_ids = random.Random(seed), itertools.count()
    while not shared.done:
        held_since = time.perf_counter()
        await buffer.wait_for_room(BATCH)  # admission control: only what the trainer can use
        shared.rollouts_held_s += time.perf_counter() - held_since
        samples = [count_sample(rng, 1, MAX_N) for _ in range(BATCH // SAMPLING.group_size)]
        halves = [samples[: len(samples) // 2], samples[len(samples) // 2 :]]
        answers = await asyncio.gather(  # one request per replica; each carries the manifest
            *(generate_.route([s.prompt for s in half], shared.manifest) for half in halves)
        )
        groups = [group for a in answers for group in a]
        rewards = [
            count_score(c.text, s.target) for s, g in zip(samples, groups, strict=True) for c in g
        ]
        episodes = to_episodes(groups, rewards, group_ids)
        for e, c in zip(episodes, (c for g in groups for c in g), strict=True):
            e.metadata.update(prompt=c.prompt, text=c.text)  # for printing only
        buffer.add_many(episodes)


async def training(trainer: Trainer, buffer: ReplayBuffer, shared: Shared, steps: int) -> None:
    """Loop 2, training: a fresh batch -> one GRPO step -> publish, `steps` times."""
    version, start = 0, time.perf_counter()
    while version < steps:
        batch = buffer.sample(version, BATCH)  # first drops what is older than the bound
        if batch is None:  # no fresh batch yet: the trainer idles
            idle_since = time.perf_counter()
            await asyncio.sleep(0.002)
            shared.trainer_idle_s += time.perf_counter() - idle_since
            continue
        episodes = list(batch.episodes)
        result = await trainer.step.call_one(episodes)
        shared.manifest = result.manifest  # the next rollout request carries it
        shared.log.append((result, episodes))
        ages = dict(sorted(Counter(version - e.policy_version for e in episodes).items()))
        reward = statistics.mean(e.reward for e in episodes)
        print(f"step {result.version:3d}  reward {reward:.2f}  episodes by age {ages}  ", end="")
        print(f"{time.perf_counter() - start:5.1f} s")
        if result.version == 1 or result.version % max(1, steps // 4) == 0:
            for e in episodes[:: BATCH // 2]:  # the first answer to two prompts
                print(f"      {e.metadata['prompt']!r} -> {e.metadata['text']!r}  ", end="")
                print(
                    f"reward {e.reward:.2f}  (made by v{e.policy_version}, trained at v{version})"
                )
        version = result.version
    shared.done = True


async def run(steps: int, seed: int, max_age: int, checkpoint: Path) -> None:
    write_random_checkpoint(checkpoint, TINY_ARCH, corpus_for("count", 1, MAX_N), seed=seed)
    buffer = ReplayBuffer(
        ReplayBufferConfig(
            max_policy_age=max_age,  # never train on an episode older than this
            group_size=SAMPLING.group_size,  # GRPO groups are kept and sampled whole
            admission_limit=BATCH,  # one batch may wait for the trainer, no more
        )
    )
    shared = Shared()
    trainer_procs = this_host().spawn_procs(per_host={"procs": 1}, name="trainer")
    gens: Service[Generator] | None = None
    try:
        trainer = trainer_procs.spawn("trainer", Trainer, str(checkpoint))
        gens = await spawn_service(Generator, ServiceConfig(replicas=2), str(checkpoint))
        await trainer.digests.call_one()  # returns once the trainer's __init__ ran
        print(f"a trainer and 2 generators are up; {steps} steps of {BATCH} episodes\n")
        start = time.perf_counter()
        async with asyncio.TaskGroup() as loops:  # an error in either loop stops both
            producer = loops.create_task(rollouts(gens, buffer, shared, seed))
            await training(trainer, buffer, shared, steps)
            producer.cancel()  # it may be waiting for room that will never come
        wall = time.perf_counter() - start
        pulled = await gens.endpoint(Generator.pulled).fanout()
        published = await trainer.digests.call_one()
    finally:
        if gens is not None:
            await gens.shutdown()
        await trainer_procs.stop()
    check(shared, buffer, pulled, published, wall=wall, steps=steps, max_age=max_age)


def check(
    shared: Shared,
    buffer: ReplayBuffer,
    pulled: list[list[tuple[int, str]]],
    published: dict[int, str],
    *,
    wall: float,
    steps: int,
    max_age: int,
) -> None:
    rewards = [statistics.mean(e.reward for e in episodes) for _, episodes in shared.log]
    k = min(10, steps // 4)
    early, late = statistics.mean(rewards[:k]), statistics.mean(rewards[-k:])
    print(f"\nmean batch reward: steps 1-{k} {early:.2f}, steps {steps - k + 1}-{steps} {late:.2f}")
    ages = Counter(r.version - 1 - e.policy_version for r, eps in shared.log for e in eps)
    print(f"trained episodes by age {dict(sorted(ages.items()))}; dropped as too stale: ", end="")
    print(buffer.stats().evicted_stale)
    stale = [r.stale_log_ratio_mean for r, _ in shared.log if r.stale_log_ratio_mean is not None]
    fresh = max(r.fresh_log_ratio_max for r, _ in shared.log)
    print(f"|log ρ|: at most {fresh:.1e} on fresh tokens", end="")
    print(f", {statistics.mean(stale):.3f} on average on stale ones" if stale else "")
    print(
        f"of the loops' {wall:.1f} s, the trainer idled {shared.trainer_idle_s / wall:.0%} ", end=""
    )
    print(
        f"(no fresh batch), the rollouts waited {shared.rollouts_held_s / wall:.0%} (full buffer)"
    )

    versions = [v for pulls in pulled for v, _ in pulls]
    expect(max(ages) <= max_age, f"no trained episode was over {max_age} version(s) old")
    if max_age > 0:
        expect(ages[1] > 0, "some were 1 version old: generation ran while the trainer trained")
    expect(all(published[v] == d for p in pulled for v, d in p), f"all {len(versions)} pulled "
           "versions are bit-identical to what the trainer published")  # fmt: skip
    expect(fresh < 1e-4, "on fresh tokens the importance ratio is 1 (|log ρ| < 1e-4)")
    if steps >= 60:  # shorter runs are too short to judge the reward by
        expect(late - early >= 0.2, f"the reward rose by at least 0.2 ({early:.2f} -> {late:.2f})")
    else:
        print("  (whether the reward rises is checked in runs of 60 steps or more)")


def main() -> None:
    parser = argparse.ArgumentParser(description="async GRPO on a tiny model")
    parser.add_argument("--steps", type=int, default=80, help="training steps (default 80)")
    parser.add_argument("--seed", type=int, default=0, help="model init, prompts (default 0)")
    parser.add_argument("--max-policy-age", type=int, default=1, help="the bound (default 1)")
    args = parser.parse_args()
    if args.steps < 4 or args.max_policy_age < 0:
        parser.error("--steps must be at least 4 and --max-policy-age at least 0")
    with tempfile.TemporaryDirectory(prefix="example09-") as tmp:
        asyncio.run(run(args.steps, args.seed, args.max_policy_age, Path(tmp)))


if __name__ == "__main__":
    main()
