"""Example 09: the whole async RL loop on a tiny model, generation and training at once.

What it teaches
    Examples 06 to 08 in one loop. A random-init 2-layer Qwen2 learns by GRPO to answer
    `count to N:` with `1 2 ... N`. Two loops run concurrently and never call each other:

      rollouts  wait for room in the buffer -> 8 prompts, half to each generator replica,
                8 answers each -> score -> advantages within each group -> buffer
      training  a batch no older than MAX_POLICY_AGE versions -> one GRPO step -> the
                trainer stages the new weights and returns a small manifest -> the next
                rollout request carries it, and the generator pulls before it samples

    The generators are an `actor-service` service, the weights move with `rdma-tensor`, the
    buffer is `replay-buffer`'s. The model, tokenizer, task, reward, sampler and GRPO math
    are the pure functions of `apps/async_grpo`: the full version of this loop, with a
    reward service, metrics, a sync mode and presets (`uv run async-grpo`).

What to look at
    Per step: the version, the batch's reward and the age of its episodes; some
    trajectories as the trainer saw them. At the end: the reward early and late, the
    versions each generator pulled, who waited for whom, and the checks: no trained episode
    was older than MAX_POLICY_AGE, every pulled version is bit-identical to what the trainer
    published, and on fresh tokens the importance ratio is 1. Read with docs/05_async_rl.md.

Run
    uv run python examples/09_async_rl_train.py              # 80 steps: the reward rises
    uv run python examples/09_async_rl_train.py --steps 12   # a short run, as CI does
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import math
import os
import random
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from actor_service import Service, ServiceConfig, spawn_service
from async_grpo.batching import Rollout, pack, sequence_logprobs
from async_grpo.config import SamplingConfig
from async_grpo.grpo import LossConfig, group_advantages, grpo_loss
from async_grpo.model import load_policy, load_tokenizer, write_random_checkpoint
from async_grpo.presets import TINY_ARCH
from async_grpo.rewards import count_score
from async_grpo.sampling import Completion, generate
from async_grpo.tasks import Sample, corpus_for, count_sample
from monarch.actor import Actor, endpoint, this_host
from rdma_tensor import Manifest, Publisher, pull
from replay_buffer import Episode, ReplayBuffer, ReplayBufferConfig

# This example's own settings, not the app's defaults (which are tuned for the app).
SAMPLING = SamplingConfig(group_size=8, max_new_tokens=8, temperature=1.0, top_p=1.0)
LOSS = LossConfig(clip_eps=0.2, importance="clip")
LR, MAX_N, BATCH = 1e-3, 6, 64  # prompts "count to N:" with N <= 6; 64 episodes a step
MAX_POLICY_AGE = 1  # never train on an episode generated more than one version ago
RISE_CHECKED_FROM = 60  # steps; shorter runs are too short to judge the reward by


def fingerprint(model: torch.nn.Module) -> str:
    """sha256 of every weight's bytes: equal means bit-identical weights."""
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


class Generator(Actor):
    """One generator replica: samples with the weights it pulled last."""

    def __init__(self, checkpoint: str) -> None:
        torch.set_num_threads(1)  # three busy processes and this script share the cores
        self.model, self.tokenizer = load_policy(checkpoint), load_tokenizer(checkpoint)
        self.version = 0  # everyone starts from the checkpoint: that is version 0
        self.rng = torch.Generator().manual_seed(os.getpid())  # replicas sample differently
        self.pulls: list[tuple[int, str]] = []

    @endpoint
    async def generate(
        self, prompts: list[str], manifest: Manifest | None
    ) -> list[list[Completion]]:
        """Pulls the newest weights if `manifest` is newer than ours (between two batches,
        never during one), then samples `group_size` answers to each prompt."""
        if manifest is not None and manifest.version > self.version:
            self.version = (await pull(manifest, into=self.model.state_dict())).version
            self.pulls.append((self.version, fingerprint(self.model)))
        return generate(
            self.model, self.tokenizer, prompts, SAMPLING, self.version, generator=self.rng
        )

    @endpoint
    async def pulled(self) -> list[tuple[int, str]]:
        """(version, fingerprint) of every pull, in order."""
        return self.pulls


@dataclass(frozen=True)
class StepResult:
    """One optimizer step: the new version, where it is staged (`manifest`, a few KB), and
    |log ρ| = |log π_trainer - log π_generator| per response token before the update: its
    maximum over episodes of the version being trained (age 0), its mean over older ones."""

    version: int
    manifest: Manifest
    fresh_log_ratio_max: float
    stale_log_ratio_mean: float  # NaN when the batch held no older episode


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
        self.published = {0: fingerprint(self.model)}

    @endpoint
    async def step(self, episodes: list[Episode]) -> StepResult:
        rows = [(e.prompt_ids, e.response_ids, e.behavior_logprobs, e.advantage) for e in episodes]
        batch = pack(
            [Rollout(p.tolist(), r.tolist(), b.tolist(), a) for p, r, b, a in rows], self.pad
        )
        s = SAMPLING
        logprobs = sequence_logprobs(self.model, batch, s.temperature, s.top_p, self.vocab)
        # Each token's term is weighted by ρ against the behaviour log-prob the generator kept.
        loss, _ = grpo_loss(
            logprobs, batch.behaviour_logprobs, batch.advantages, batch.response_mask, LOSS
        )
        self.opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        log_ratio = (logprobs.detach() - batch.behaviour_logprobs).abs()
        fresh = torch.tensor([e.policy_version == self.version for e in episodes]).unsqueeze(1)
        real = batch.response_mask > 0
        on, off = log_ratio[real & fresh], log_ratio[real & ~fresh]
        self.version += 1
        # One copy into CPU staging, a small manifest back; no generator is waited for.
        manifest = self.publisher.publish(self.model.state_dict(), self.version)
        self.published[self.version] = fingerprint(self.model)
        return StepResult(
            self.version,
            manifest,
            float(on.max()) if on.numel() else 0.0,
            float(off.mean()) if off.numel() else math.nan,
        )

    @endpoint
    async def fingerprints(self) -> dict[int, str]:
        """The fingerprint of every version published, by version."""
        return self.published

    @endpoint
    async def close(self) -> None:
        self.publisher.close()


@dataclass
class Shared:
    """What the two loops share (one event loop, so no locks)."""

    manifest: Manifest | None = None  # the newest published weights
    done: bool = False
    trainer_idle_s: float = 0.0  # waiting for a fresh batch
    rollouts_held_s: float = 0.0  # waiting for room in the buffer


def score(sample: Sample, group: list[Completion], group_id: int) -> list[Episode]:
    """Rewards for one prompt's answers; each answer's advantage is relative to its group."""
    rewards = [count_score(c.text, sample.target) for c in group]
    advantages = group_advantages(torch.tensor(rewards), len(group)).tolist()
    return [
        Episode(
            prompt_ids=torch.tensor(c.prompt_ids),
            response_ids=torch.tensor(c.response_ids),
            behavior_logprobs=torch.tensor(c.logprobs),
            reward=r,
            advantage=a,
            policy_version=c.policy_version,
            group_id=group_id,
            metadata={"prompt": sample.prompt, "response": c.text},
        )
        for c, r, a in zip(group, rewards, advantages, strict=True)
    ]


async def rollouts(
    generators: Service[Generator], buffer: ReplayBuffer, shared: Shared, seed: int
) -> None:
    """Loop 1, generation: room -> prompts -> answers -> rewards -> buffer, until done."""
    generate_ = generators.endpoint(Generator.generate)
    rng, group_ids = random.Random(seed), itertools.count()
    while not shared.done:
        # Admission control: generate only what fits, so nothing waits long enough to go stale.
        held_since = time.perf_counter()
        await buffer.wait_for_room(BATCH)
        shared.rollouts_held_s += time.perf_counter() - held_since
        samples = [count_sample(rng, 1, MAX_N) for _ in range(BATCH // SAMPLING.group_size)]
        halves = [samples[: len(samples) // 2], samples[len(samples) // 2 :]]
        # One request per replica, at once; each carries the newest manifest.
        answers = await asyncio.gather(
            *(generate_.route([s.prompt for s in half], shared.manifest) for half in halves)
        )
        groups = [g for a in answers for g in a]
        buffer.add_many(
            e for s, g in zip(samples, groups, strict=True) for e in score(s, g, next(group_ids))
        )


async def training(
    trainer: Trainer, buffer: ReplayBuffer, shared: Shared, steps: int
) -> list[tuple[StepResult, list[Episode]]]:
    """Loop 2, training: a fresh batch -> one GRPO step -> publish, `steps` times."""
    log: list[tuple[StepResult, list[Episode]]] = []
    version, start = 0, time.perf_counter()
    while version < steps:
        batch = buffer.sample(version, BATCH)  # first drops what is older than MAX_POLICY_AGE
        if batch is None:  # no fresh batch yet: the trainer idles
            idle_since = time.perf_counter()
            await asyncio.sleep(0.002)
            shared.trainer_idle_s += time.perf_counter() - idle_since
            continue
        episodes = list(batch.episodes)
        result = await trainer.step.call_one(episodes)
        shared.manifest = result.manifest  # the next rollout request carries it
        log.append((result, episodes))
        ages = dict(sorted(Counter(version - e.policy_version for e in episodes).items()))
        reward = statistics.mean(e.reward for e in episodes)
        print(
            f"step {result.version:3d}  v{version} -> v{result.version}  reward {reward:.2f}  "
            f"episodes by age {ages}  {time.perf_counter() - start:5.1f} s"
        )
        if result.version == 1 or result.version % max(1, steps // 4) == 0:
            for e in episodes[:: BATCH // 2]:  # the first answer to two different prompts
                print(
                    f"      {e.metadata['prompt']!r} -> {e.metadata['response']!r}  reward "
                    f"{e.reward:.2f}  (made by v{e.policy_version}, trained at v{version}: "
                    f"age {version - e.policy_version})"
                )
        version = result.version
    shared.done = True
    return log


def expect(ok: bool, what: str) -> None:
    """Print a check's outcome; a failed check ends the example with a non-zero status."""
    if not ok:
        raise RuntimeError(f"check failed: {what}")
    print(f"  ok: {what}")


async def run(steps: int, seed: int, checkpoint: Path) -> None:
    write_random_checkpoint(checkpoint, TINY_ARCH, corpus_for("count", 1, MAX_N), seed=seed)
    buffer = ReplayBuffer(
        ReplayBufferConfig(
            max_policy_age=MAX_POLICY_AGE,
            group_size=SAMPLING.group_size,  # GRPO groups are kept and sampled whole
            admission_limit=BATCH,  # one batch may wait for the trainer, no more
        )
    )
    shared = Shared()
    trainer_procs = this_host().spawn_procs(per_host={"procs": 1}, name="trainer")
    generators: Service[Generator] | None = None
    try:
        trainer = trainer_procs.spawn("trainer", Trainer, str(checkpoint))
        config = ServiceConfig(replicas=2, name="generators")
        generators = await spawn_service(Generator, config, str(checkpoint))
        await trainer.fingerprints.call_one()  # returns once the trainer's __init__ ran
        print(f"a trainer and 2 generators are up; {steps} steps of {BATCH} episodes each\n")
        start = time.perf_counter()
        async with asyncio.TaskGroup() as loops:  # an error in either loop stops both
            producer = loops.create_task(rollouts(generators, buffer, shared, seed))
            log = await training(trainer, buffer, shared, steps)
            producer.cancel()  # it may be waiting for room that will never come
        wall = time.perf_counter() - start
        pulled = await generators.endpoint(Generator.pulled).fanout()
        published = await trainer.fingerprints.call_one()
        await trainer.close.call_one()
    finally:
        if generators is not None:
            await generators.shutdown()
        await trainer_procs.stop()

    rewards = [statistics.mean(e.reward for e in episodes) for _, episodes in log]
    k = min(10, steps // 4)
    early, late = statistics.mean(rewards[:k]), statistics.mean(rewards[-k:])
    print(f"\nmean batch reward: steps 1-{k} {early:.2f}, steps {steps - k + 1}-{steps} {late:.2f}")
    for i, pulls in enumerate(pulled):
        vs = [f"v{v}" for v, _ in pulls]
        shown = " ".join(vs if len(vs) <= 12 else [*vs[:5], "...", *vs[-5:]])
        print(f"generator {i} pulled {len(vs)} versions: {shown}")
    ages = Counter(r.version - 1 - e.policy_version for r, episodes in log for e in episodes)
    print(f"trained episodes by age {dict(sorted(ages.items()))}; ", end="")
    print(f"dropped unused as too stale: {buffer.stats().evicted_stale}")
    fresh = max(r.fresh_log_ratio_max for r, _ in log)
    stale = [r.stale_log_ratio_mean for r, _ in log if not math.isnan(r.stale_log_ratio_mean)]
    print(f"|log ρ|: at most {fresh:.1e} on fresh tokens, ", end="")
    print(f"{statistics.mean(stale) if stale else math.nan:.3f} on average on stale ones")
    print(
        f"of the loops' {wall:.1f} s, the trainer idled {shared.trainer_idle_s / wall:.0%} "
        f"(no fresh batch), the rollouts waited {shared.rollouts_held_s / wall:.0%} (full buffer)"
    )

    held = [[v for v, _ in pulls] for pulls in pulled]
    versions = [v for h in held for v in h]
    expect(max(ages) <= MAX_POLICY_AGE, f"no trained episode was over {MAX_POLICY_AGE} version old")
    if MAX_POLICY_AGE > 0:  # 0 turns the overlap off: see docs/05_async_rl.md
        expect(ages[1] > 0, "some were 1 version old: generation ran while the trainer trained")
    expect(
        all(h == sorted(set(h)) for h in held)
        and max(versions, default=0) >= steps - 1 - MAX_POLICY_AGE,
        f"the generators' versions only moved forward, up to v{max(versions, default=0)}",
    )
    expect(
        all(published[v] == f for pulls in pulled for v, f in pulls),
        f"all {len(versions)} pulled versions are bit-identical to what the trainer published",
    )
    expect(fresh < 1e-4, "on fresh tokens the importance ratio is 1 (|log ρ| < 1e-4)")
    if steps >= RISE_CHECKED_FROM:
        expect(late - early >= 0.2, f"the reward rose by at least 0.2 ({early:.2f} -> {late:.2f})")
    else:
        print(f"  (whether the reward rises is checked in runs of {RISE_CHECKED_FROM}+ steps)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=80, help="training steps (default 80)")
    parser.add_argument("--seed", type=int, default=0, help="model init, prompts (default 0)")
    args = parser.parse_args()
    if args.steps < 4:
        parser.error("--steps must be at least 4")
    with tempfile.TemporaryDirectory(prefix="example09-") as tmp:
        asyncio.run(run(args.steps, args.seed, Path(tmp)))


if __name__ == "__main__":
    main()
