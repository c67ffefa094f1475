"""The train step with LoRA adapters, without Monarch: a real tiny Qwen2 and real peft. Only
the adapters move and only they are in AdamW; a generator holding the same adapter tensors
samples exactly the distribution the trainer recomputes (importance ratio 1 on-policy)."""

import itertools
from pathlib import Path

import pytest
import torch
from async_grpo.config.schema import LoraConfig, SamplingConfig, TrainerConfig
from async_grpo.generation.decoding import generate
from async_grpo.generation.episodes import to_episodes
from async_grpo.grpo.step import TrainerCore
from async_grpo.model.lora import adapter_state, add_adapters, train_adapter_dropout
from async_grpo.model.policy import load_policy, load_tokenizer
from peft import PeftModel
from replay_buffer import EpisodeBatch
from transformers import PreTrainedModel

SAMPLING = SamplingConfig(group_size=4, max_new_tokens=6, temperature=0.9, top_p=0.95)
PROMPTS = ["count to 3:", "count to 5:"]


def lora_core(checkpoint: Path, lora: LoraConfig) -> tuple[TrainerCore, PeftModel]:
    torch.manual_seed(0)
    model = load_policy(str(checkpoint))
    adapter = add_adapters(model, lora)
    tok = load_tokenizer(str(checkpoint))
    cfg = TrainerConfig(lr=1e-2, lora=lora)
    core = TrainerCore(
        model, cfg, SAMPLING, vocab_size=len(tok), pad_id=int(tok.pad_token_id), total_steps=10
    )
    return core, adapter


def episodes_from(model: PreTrainedModel, checkpoint: Path, seed: int) -> EpisodeBatch:
    tok = load_tokenizer(str(checkpoint))
    rng = torch.Generator().manual_seed(seed)
    groups = generate(model, tok, PROMPTS, SAMPLING, 0, generator=rng)
    rewards = [float(i % 3) / 2 for i in range(len(PROMPTS) * SAMPLING.group_size)]
    return to_episodes(groups, rewards, itertools.count())


def test_only_the_adapters_train(tiny_checkpoint: Path) -> None:
    core, adapter = lora_core(tiny_checkpoint, LoraConfig(rank=4))
    in_adam = [p.data_ptr() for g in core.optimizer.param_groups for p in g["params"]]
    assert len(in_adam) == 28
    assert set(in_adam) == {t.data_ptr() for t in adapter_state(adapter).values()}
    before = {n: p.detach().clone() for n, p in core.model.named_parameters()}
    for step in range(2):
        core.step(episodes_from(core.model, tiny_checkpoint, step), None)
    after = dict(core.model.named_parameters())
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed
    assert all("lora_" in n for n in changed)
    # lora_B of every targeted layer moved away from zero, so the adapter now matters.
    assert all(bool(t.any()) for n, t in adapter_state(adapter).items() if "lora_B" in n)


def test_a_generator_with_the_same_adapter_is_on_policy(tiny_checkpoint: Path) -> None:
    core, trained = lora_core(tiny_checkpoint, LoraConfig(rank=4, alpha=8))
    for step in range(3):  # adapters far from their initial zero
        core.step(episodes_from(core.model, tiny_checkpoint, step), None)
    # The generator's own copy: the checkpoint, wrapped alike, its adapter tensors filled with
    # the trainer's by name (what a pull does), its own random A overwritten.
    torch.manual_seed(123)
    policy = load_policy(str(tiny_checkpoint))
    generator = add_adapters(policy, LoraConfig(rank=4, alpha=8))
    theirs = adapter_state(trained)
    with torch.no_grad():
        for name, tensor in adapter_state(generator).items():
            tensor.copy_(theirs[name])
    stats = core.step(episodes_from(policy, tiny_checkpoint, 7), None)
    assert stats.loss.ratio_mean == pytest.approx(1.0, abs=1e-5)
    assert stats.loss.clip_frac == 0.0
    # Without the adapter the generator samples another distribution: the check can fail.
    with generator.disable_adapter():
        off = episodes_from(policy, tiny_checkpoint, 8)
    assert core.step(off, None).loss.ratio_mean != pytest.approx(1.0, abs=1e-3)


def test_adapter_dropout_is_the_trainers_alone(tiny_checkpoint: Path) -> None:
    core, _ = lora_core(tiny_checkpoint, LoraConfig(rank=4, dropout=0.3))
    core.step(episodes_from(core.model, tiny_checkpoint, 0), None)
    on_policy = episodes_from(core.model, tiny_checkpoint, 1)
    assert core.step(on_policy, None).loss.ratio_mean == pytest.approx(1.0, abs=1e-5)
    core.model.train(False)
    again = episodes_from(core.model, tiny_checkpoint, 2)
    train_adapter_dropout(core.model)
    assert core.step(again, None).loss.ratio_mean != pytest.approx(1.0, abs=1e-5)
