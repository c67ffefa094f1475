"""Example 10: multi-turn episodes against an environment service, and a tool run in a sandbox.

What it teaches
    An agent episode is a conversation: the environment says something, the model answers,
    the environment answers that, until it says `done`. `rl-envs` serves environments as
    `actor-service` services (one sticky session per episode, so every step reaches the
    replica that holds it). The app's `multiturn.play` plays a whole GRPO group at once and
    samples every episode's next turn in one batch; `rollout.records_to_episodes` turns the
    finished episodes into training data whose loss mask covers the model's tokens only:
    the environment's words are context, never trained on. A replica killed mid-episode
    fails that episode, and its whole group is dropped, never half-recorded. Last, a tool:
    the calculator runs the model's answer as Python in a bubblewrap sandbox (skipped,
    with the package named, where bubblewrap is missing).

What to look at
    The conversation of one episode; the episode as the trainer sees it, each token marked
    `^` where the loss applies; after the SIGKILL, the failed episodes and the dropped
    group; the sandbox's verdict on a right and a wrong expression.

Run
    uv run python examples/10_multi_turn_env.py
"""

from __future__ import annotations

import os

# Monarch notices a dead process by polling it; 1 s instead of its default (about 10 s).
os.environ.setdefault("HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY", "1s")

import asyncio
import itertools
import signal
import tempfile
from collections.abc import Sequence
from pathlib import Path

from _checks import expect
from actor_service import ServiceConfig
from async_grpo.config.presets import TINY_ARCH
from async_grpo.config.schema import ModelConfig, SamplingConfig
from async_grpo.controller.play import make_encode
from async_grpo.generation.decoding import Completion
from async_grpo.generation.engines.hf import HFEngine
from async_grpo.generation.episodes import records_to_episodes
from async_grpo.generation.multiturn import play
from async_grpo.model.policy import load_tokenizer, write_random_checkpoint
from rl_envs import (
    Calculator,
    PolicyTurn,
    RepeatAfterMe,
    Sandbox,
    SandboxUnavailableError,
    Segment,
    Task,
    run_episode,
    spawn_environment,
)

GROUP = 4


async def main(tmp: Path) -> None:
    # A random tiny Qwen2 whose word-level tokenizer knows every word the game says.
    checkpoint = write_random_checkpoint(tmp / "ckpt", TINY_ARCH, RepeatAfterMe.corpus(), seed=0)
    tokenizer = load_tokenizer(str(checkpoint))
    encode = make_encode(tokenizer)
    engine = HFEngine(str(checkpoint), ModelConfig(), SamplingConfig(GROUP, 1), seed=0)

    async def model(contexts: list[list[int]]) -> list[Completion]:
        return engine.continue_turns(contexts)  # a turn is one word (max_new_tokens 1)

    config = ServiceConfig(replicas=2, name="repeat", max_in_flight_per_replica=32)
    env = await spawn_environment("repeat", config)
    try:
        print("== two tasks, a group of 4 episodes each, played at once")
        tasks = [Task("repeat", seed=1, level=1), Task("repeat", seed=2, level=1)]
        groups = await play(
            model, encode, {"repeat": env}, tasks, GROUP, max_turns=8, step_timeout_s=30
        )
        record = groups[0][0]
        for segment in record.segments:
            print(f"  {segment.source:>11}: {segment.text!r:60} reward {segment.reward:.2f}")
        expect(
            all(r.ok and r.done and r.turns == 3 for g in groups for r in g),
            "8 episodes, 3 turns each",
        )

        print("== the first episode as the trainer sees it (^: in the loss)")
        episodes, dropped = records_to_episodes(groups, itertools.count(), encode)
        e = episodes[0]
        assert e.loss_mask is not None
        words = [tokenizer.convert_ids_to_tokens(int(t)) for t in e.response_ids]
        print("  prompt   ", " ".join(tokenizer.convert_ids_to_tokens(e.prompt_ids.tolist())))
        print("  response ", " ".join(f"{w:>7}" for w in words))
        print("  loss     ", " ".join(f"{'^' if m else '':>7}" for m in e.loss_mask.tolist()))
        # Compared as token ids: a turn that sampled the end token has the text "".
        mask = e.loss_mask.tolist()
        in_loss = [t for t, m in zip(e.response_ids.tolist(), mask, strict=True) if m]
        turns = [s.payload for s in record.segments if s.payload is not None]
        sampled = [t for turn in turns for t in turn.response_ids]
        expect(in_loss == sampled, "the loss covers exactly the model's tokens")
        expect(dropped == 0 and len(episodes) == 8, "every episode became a training episode")

        print("== a replica SIGKILLed while its episodes wait for their next turn")
        status = env.status()
        victim = status.replicas[0].pids[0]

        killed: list[int] = []

        async def kill_then_answer(contexts: list[list[int]]) -> list[Completion]:
            if not killed:  # before the first turn is answered: every episode is open
                os.kill(victim, signal.SIGKILL)
                killed.append(victim)
                await asyncio.sleep(3)  # Monarch's supervision notices within about a second
            return await model(contexts)

        many = [Task("repeat", seed=s) for s in range(4)]
        hit = await play(
            kill_then_answer, encode, {"repeat": env}, many, GROUP, max_turns=8, step_timeout_s=30
        )
        failed = [r for g in hit for r in g if not r.ok]
        kinds = sorted({r.error.kind for r in failed if r.error})
        print(f"  {len(failed)} episodes failed ({', '.join(kinds)}); none holds a segment")
        kept, dropped = records_to_episodes(hit, itertools.count(), encode)
        print(f"  {len(kept)} episodes kept, {dropped} dropped (whole groups)")
        expect(bool(failed) and all(not r.segments for r in failed), "failed episodes hold nothing")
        expect(
            dropped % GROUP == 0 and len(kept) + dropped == 16,
            "a group with a failure is dropped whole",
        )
    finally:
        await env.shutdown()

    print("== a tool: the calculator runs the answer in a bubblewrap sandbox")
    try:
        calculator = Calculator(Sandbox(), attempts=2)
    except SandboxUnavailableError as e:
        print(f"  skipped: needs the distribution package `bubblewrap` ({e})")
        return
    task = Task("calculator", seed=3)
    (a, b), (op,) = Calculator.content(task)  # the question says it in words: "3 times 5"
    right = f"{a} {op} {b}"
    answers = iter(["__import__('os').listdir('/')", right])

    async def scripted(conversation: Sequence[Segment[None]]) -> PolicyTurn[None]:
        return PolicyTurn(next(answers), None)

    played = await run_episode(scripted, calculator, task)
    for step in played.segments:
        print(f"  {step.source:>11}: {step.text!r:70} reward {step.reward:.2f}")
    expect(played.done and played.rewards == (0.0, 0.5), "wrong first (not a number), right second")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        asyncio.run(main(Path(d)))
