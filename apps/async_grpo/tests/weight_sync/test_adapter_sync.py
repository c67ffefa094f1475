"""LoRA weight sync between real processes: a `Trainer` actor with adapters publishes each
version, a `Generator` replica (the `hf` engine) pulls it. Only the adapter's tensors move,
the generator then holds the trainer's weights bit for bit, and its samples are on-policy for
the trainer (importance ratio 1 at equal weights)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from async_grpo.actors.generator import Generator
from async_grpo.actors.trainer import Trainer, TrainResult
from async_grpo.config.schema import (
    GeneratorConfig,
    LoraConfig,
    ModelConfig,
    SamplingConfig,
    TrainerConfig,
)
from async_grpo.generation.episodes import to_episodes
from async_grpo.model.policy import load_policy
from monarch.actor import this_host
from rdma_tensor import Manifest
from replay_buffer import EpisodeBatch

SAMPLING = SamplingConfig(group_size=4, max_new_tokens=6, temperature=0.9)
PROMPTS = ["count to 3:", "count to 5:"]
LORA = LoraConfig(rank=4, alpha=8)


async def batch(gen: Generator, seed: int) -> EpisodeBatch:
    groups = await gen.generate.call_one(PROMPTS, seed)
    rewards = [float(i % 3) / 2 for i in range(len(PROMPTS) * SAMPLING.group_size)]
    return to_episodes(groups, rewards, itertools.count())


@pytest.mark.slow  # Monarch processes
async def test_only_the_adapter_moves_and_the_generator_stays_on_policy(
    tiny_checkpoint: Path,
) -> None:
    trainer_procs = this_host().spawn_procs(per_host={"procs": 1})
    gen_procs = this_host().spawn_procs(per_host={"procs": 1})
    try:
        cfg = TrainerConfig(lr=1e-2, batch_size=8, lora=LORA)
        trainer = trainer_procs.spawn(
            "trainer", Trainer, str(tiny_checkpoint), cfg, SAMPLING, 0, 10
        )
        gen = gen_procs.spawn(
            "generator",
            Generator,
            str(tiny_checkpoint),
            ModelConfig(),
            SAMPLING,
            0,
            GeneratorConfig(),
            lora=LORA,
        )
        initial = await trainer.publish_initial.call_one()
        assert isinstance(initial, Manifest)
        whole = load_policy(str(tiny_checkpoint)).state_dict()
        full_bytes = sum(t.numel() * t.element_size() for t in whole.values())
        assert all(".lora_" in e.name for e in initial.bucket_layout.entries)
        assert initial.nbytes < full_bytes / 4
        for step in range(3):
            result: TrainResult = await trainer.train_step.call_one(await batch(gen, step), None)
            # Sampled by the weights the trainer held (version 0: B is zero on both sides,
            # whatever A each drew): on-policy.
            assert result.stats.ratio_mean == pytest.approx(1.0, abs=1e-5)
            assert result.stats.clip_frac == 0.0
            assert result.update.nbytes == initial.nbytes
            synced = await gen.update_weights.call_one(result.update)
            assert synced.version == result.version == step + 1
            # Sent again (as the broadcast does after a request brought it), the version is
            # not pulled twice, and the answer is the pull that brought it.
            assert synced.seconds > 0
            assert await gen.update_weights.call_one(result.update) == synced
        theirs = await trainer.full_weights.call_one()
        version, mine = await gen.weights.call_one()
        assert version == 3
        assert mine.keys() == theirs.keys()
        assert all(torch.equal(mine[n], theirs[n]) for n in mine), "not bit for bit"
        assert any(bool(t.any()) for n, t in theirs.items() if "lora_B" in n)
        base = {n.replace(".base_layer", ""): t for n, t in mine.items() if "lora_" not in n}
        assert all(torch.equal(t, whole[n]) for n, t in base.items()), "a base weight moved"
    finally:
        await trainer_procs.stop()
        await gen_procs.stop()
