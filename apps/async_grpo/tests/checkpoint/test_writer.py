"""One `CheckpointWriter` through a whole run: checkpoint after checkpoint, each one the
trainer as it was when it was taken. Real tiny Qwen2, real DCP files, no Monarch.

The second checkpoint is the one that failed on the GPU machine's torch 2.11 (its stager
served one checkpoint only); `uv run nox -s gpu_rehearsal` runs the app on that version
with a checkpoint every step."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import torch
from async_grpo.checkpoint.trainer_state import CheckpointWriter, load_trainer_state
from async_grpo.config.schema import SamplingConfig, TrainerConfig
from async_grpo.generation.decoding import generate
from async_grpo.generation.episodes import to_episodes
from async_grpo.grpo.step import TrainerCore
from async_grpo.model.policy import load_policy, load_tokenizer

SAMPLING = SamplingConfig(group_size=4, max_new_tokens=4)


def core(checkpoint: Path, seed: int) -> TrainerCore:
    torch.manual_seed(seed)
    model = load_policy(str(checkpoint))
    tok = load_tokenizer(str(checkpoint))
    return TrainerCore(
        model, TrainerConfig(lr=5e-2), SAMPLING, vocab_size=len(tok), pad_id=0, total_steps=5
    )


def step(trainer: TrainerCore, checkpoint: Path, seed: int) -> None:
    tok = load_tokenizer(str(checkpoint))
    rng = torch.Generator().manual_seed(seed)
    groups = generate(trainer.model, tok, ["count to 3:"], SAMPLING, 0, generator=rng)
    trainer.step(to_episodes(groups, [0.0, 1.0, 0.5, 1.0], itertools.count()), None)


def test_one_writer_writes_checkpoint_after_checkpoint(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    trainer = core(tiny_checkpoint, seed=0)
    writer = CheckpointWriter(sharded=False)
    taken: list[tuple[Path, dict[str, torch.Tensor]]] = []
    for n in range(3):
        step(trainer, tiny_checkpoint, seed=n)
        path = tmp_path / f"step-{n}"
        writer.start(trainer, path)
        weights = {k: p.detach().clone() for k, p in trainer.model.named_parameters()}
        taken.append((path, weights))
        writer.staged()  # the next step may change the weights only after the copy
    asyncio.run(writer.wait())
    assert not writer.writing
    # Each step moved the weights, so each checkpoint must be its own moment's.
    assert not torch.equal(
        taken[0][1]["model.embed_tokens.weight"], taken[2][1]["model.embed_tokens.weight"]
    )
    for n, (path, weights) in enumerate(taken):
        restored = core(tiny_checkpoint, seed=99)
        load_trainer_state(restored, path, sharded=False)
        assert restored.version == n + 1
        mine = dict(restored.model.named_parameters())
        assert all(torch.equal(mine[k], w) for k, w in weights.items()), path.name
