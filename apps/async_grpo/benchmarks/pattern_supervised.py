"""Can the tiny model follow the pattern at all? Supervised training on the right answers.

When the `pattern` preset's first RL runs stalled near 0.57 (docs/07_environments.md), this
separated the model from the learning signal: the same tiny model (`presets.TINY_ARCH`, the
app's word-level tokenizer built from `FollowThePattern.corpus()`) is trained with cross-entropy
on the right answer of every cue, in episodes played right against the environment and
laid out by `rl_envs.tokenize_episode`, as the app's trainer gets them. It is
scored as the app scores it: `rl_envs.run_episode` plays the real environment on its
held-out tasks, answers sampled at temperature 1, mean return.

    uv run python apps/async_grpo/benchmarks/pattern_supervised.py            # 400 steps
    uv run python apps/async_grpo/benchmarks/pattern_supervised.py --tasks 8  # less variety
    uv run python apps/async_grpo/benchmarks/pattern_supervised.py --words 48 # a larger pool

`--tasks` distinct tasks per step (default 128, one sequence each), AdamW at `--lr`;
`--words` nouns in the game's pool (16: the environment as it is).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from collections.abc import Sequence

import torch
from async_grpo.config.presets import TINY_ARCH
from async_grpo.controller.play import make_encode
from async_grpo.model.policy import qwen2_config
from async_grpo.model.tokenizer import build_tokenizer
from rl_envs import (
    FollowThePattern,
    PolicyTurn,
    Segment,
    Task,
    context_ids,
    run_episode,
    tokenize_episode,
)
from rl_envs.envs._words import WORDS
from transformers import Qwen2ForCausalLM


def pool(words: int) -> type[FollowThePattern]:
    """The game over the first `words` nouns (16: the environment as it is)."""
    if words == len(FollowThePattern.words):
        return FollowThePattern
    attrs = {"name": f"pattern{words}", "words": WORDS[:words], "max_level": words // 2 - 2}
    return type(f"FollowThePattern{words}", (FollowThePattern,), attrs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--tasks", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--words", type=int, default=len(FollowThePattern.words))
    args = parser.parse_args()
    for flag in ("steps", "tasks", "eval_every"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1")
    if not args.lr > 0:
        parser.error("--lr must be > 0")
    if not 4 <= args.words <= len(WORDS):
        parser.error(f"--words must be in [4, {len(WORDS)}] (two rules need four words)")
    game = pool(args.words)
    torch.manual_seed(args.seed)
    tok = build_tokenizer(game.corpus())
    model = Qwen2ForCausalLM(qwen2_config(TINY_ARCH, tok))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99))

    encode = make_encode(tok)

    async def sequence(task: Task) -> tuple[list[int], list[int]]:
        """The episode played right (the environment's own text, every answer the rule's
        word), as the app's trainer sees it (`rl_envs.tokenize_episode`); and the positions
        of the answers."""
        answer = dict(game.content(task)[0])

        async def oracle(conversation: Sequence[Segment[list[int]]]) -> PolicyTurn[list[int]]:
            word = answer[conversation[-1].text.split()[-1]]  # the cue ends the observation
            return PolicyTurn(word, encode(word))

        record = await run_episode(oracle, game(), task)
        view = tokenize_episode(
            record, encode=encode, token_ids=lambda p: p, logprobs=lambda p: [0.0] * len(p)
        )
        start = len(view.prompt_ids)
        where = [start + i for i, policy in enumerate(view.policy_mask) if policy]
        return view.prompt_ids + view.response_ids, where

    async def batch_of(n: int) -> list[tuple[list[int], list[int]]]:
        return [await sequence(Task(game.name, next(seeds), "train", 0)) for _ in range(n)]

    async def policy(conversation: Sequence[Segment[list[int]]]) -> PolicyTurn[list[int]]:
        ids = context_ids(conversation, encode=encode, token_ids=lambda p: p)
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].float()
        token = int(torch.multinomial(torch.softmax(logits, -1), 1))
        return PolicyTurn(str(tok.decode([token])), [token])

    async def evaluate() -> float:
        env = game()
        records = [await run_episode(policy, env, t) for t in game.eval_tasks(0)]
        return sum(r.reward for r in records) / len(records)

    seeds = itertools.count(args.seed * 1_000_000)
    print(
        f"supervised, {args.words} words, {args.tasks} tasks per step, lr {args.lr}, eval on "
        "64 held-out tasks"
    )
    start = time.perf_counter()
    for step in range(args.steps + 1):
        if step % args.eval_every == 0 or step == args.steps:
            score = asyncio.run(evaluate())
            print(f"step {step:5d}  eval {score:.3f}  {time.perf_counter() - start:5.0f}s")
        if step == args.steps:
            break
        batch = asyncio.run(batch_of(args.tasks))
        ids = torch.tensor([s for s, _ in batch])  # level 0: every sequence has one length
        where = torch.tensor([w for _, w in batch])
        logits = model(ids).logits.float()
        pred = logits.gather(1, (where - 1).unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
        loss = torch.nn.functional.cross_entropy(pred.flatten(0, 1), ids.gather(1, where).flatten())
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()


if __name__ == "__main__":
    main()
