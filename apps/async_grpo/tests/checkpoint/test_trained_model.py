"""A LoRA trainer's checkpoint: what it holds, restoring it, and the policy in it, merged or
as the adapter alone. Real tiny Qwen2, real peft, real DCP files. Exporting them to a
directory and loading that back: `test_export.py`."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest
import torch
from async_grpo.checkpoint.trained_model import trained_adapter, trained_policy
from async_grpo.checkpoint.trainer_state import CheckpointWriter, load_trainer_state
from async_grpo.config.schema import LoraConfig, SamplingConfig, TrainerConfig
from async_grpo.generation.decoding import generate
from async_grpo.generation.episodes import to_episodes
from async_grpo.grpo.step import TrainerCore
from async_grpo.model.lora import adapter_state, add_adapters
from async_grpo.model.policy import load_policy, load_tokenizer
from peft import PeftModel
from torch.distributed.checkpoint.filesystem import FileSystemReader

LORA = LoraConfig(rank=4, alpha=8, target_modules="q_proj,v_proj,down_proj")
SAMPLING = SamplingConfig(group_size=4, max_new_tokens=5)
IDS = torch.tensor([[3, 4, 5, 6, 7, 8]])


def lora_core(checkpoint: Path, seed: int = 0) -> TrainerCore:
    torch.manual_seed(seed)
    model = load_policy(str(checkpoint))
    add_adapters(model, LORA)
    tok = load_tokenizer(str(checkpoint))
    return TrainerCore(
        model,
        TrainerConfig(lr=5e-2, lora=LORA),
        SAMPLING,
        vocab_size=len(tok),
        pad_id=int(tok.pad_token_id),
        total_steps=10,
    )


def train(core: TrainerCore, checkpoint: Path, steps: int) -> None:
    tok = load_tokenizer(str(checkpoint))
    for step in range(steps):
        rng = torch.Generator().manual_seed(step)
        groups = generate(
            core.model, tok, ["count to 4:", "count to 2:"], SAMPLING, 0, generator=rng
        )
        rewards = [float(i % 3) / 2 for i in range(2 * SAMPLING.group_size)]
        core.step(to_episodes(groups, rewards, itertools.count()), None)


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = model(input_ids=IDS).logits
    return out


@pytest.fixture(scope="module")
def saved(
    tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, TrainerCore]:
    """A LoRA trainer after 2 steps and its checkpoint's trainer directory."""
    core = lora_core(tiny_checkpoint)
    train(core, tiny_checkpoint, 2)
    path = tmp_path_factory.mktemp("lora-ckpt") / "trainer"
    writer = CheckpointWriter(sharded=False)
    writer.start(core, path)
    asyncio.run(writer.wait())
    return path, core


def test_the_checkpoint_holds_the_adapters_and_their_moments_alone(
    saved: tuple[Path, TrainerCore],
) -> None:
    path, _ = saved
    keys = set(FileSystemReader(str(path)).read_metadata().state_dict_metadata)
    weights = {k for k in keys if k.startswith("model.")}
    assert len(weights) == 3 * 2 * 2  # q, v, down of 2 layers, A and B
    assert all(".lora_A." in k or ".lora_B." in k for k in weights)
    assert not any("embed_tokens" in k or "lm_head" in k or "norm" in k for k in keys)
    assert any(k.startswith("optim.state.") and k.endswith("exp_avg_sq") for k in keys)


def test_a_restored_trainer_continues_bit_for_bit(
    saved: tuple[Path, TrainerCore], tiny_checkpoint: Path
) -> None:
    path, core = saved
    restored = lora_core(tiny_checkpoint, seed=99)  # another random A until restored
    load_trainer_state(restored, path, sharded=False)
    assert restored.version == core.version == 2
    mine, theirs = dict(restored.model.named_parameters()), dict(core.model.named_parameters())
    assert all(torch.equal(mine[n], theirs[n]) for n in theirs)
    # AdamW's moments came back too, for exactly the adapters, so the next step is the same.
    theirs_adam = [core.optimizer.state[p] for p in core.trained]
    mine_adam = [restored.optimizer.state[p] for p in restored.trained]
    assert len(mine_adam) == len(theirs_adam) == 12
    for m, t in zip(mine_adam, theirs_adam, strict=True):
        assert m.keys() == t.keys()
        assert all(torch.equal(m[k], t[k]) for k in t)


def test_the_merged_policy_is_base_plus_adapter(
    saved: tuple[Path, TrainerCore], tiny_checkpoint: Path
) -> None:
    path, core = saved
    merged = trained_policy(path, str(tiny_checkpoint), LORA)
    assert type(merged).__name__ == "Qwen2ForCausalLM"
    assert not any("lora" in n for n, _ in merged.named_parameters())
    torch.testing.assert_close(logits(merged), logits(core.model), atol=1e-5, rtol=1e-5)
    # The merge itself, by hand on one layer: W + (alpha / rank) B A.
    base = load_policy(str(tiny_checkpoint)).state_dict()
    trained = {n: p.detach() for n, p in core.model.named_parameters()}
    prefix = "model.layers.1.self_attn.q_proj"
    a, b = trained[f"{prefix}.lora_A.default.weight"], trained[f"{prefix}.lora_B.default.weight"]
    by_hand = base[f"{prefix}.weight"] + (LORA.alpha / LORA.rank) * b @ a
    torch.testing.assert_close(merged.state_dict()[f"{prefix}.weight"], by_hand)
    assert torch.equal(merged.state_dict()["model.norm.weight"], base["model.norm.weight"])


def test_the_adapter_alone_is_the_trainers(
    saved: tuple[Path, TrainerCore], tiny_checkpoint: Path
) -> None:
    path, core = saved
    adapter = trained_adapter(path, str(tiny_checkpoint), LORA)
    assert isinstance(adapter, PeftModel)
    theirs = adapter_state(adapter)
    mine = {n: p.detach() for n, p in core.model.named_parameters() if p.requires_grad}
    assert len(theirs) == len(mine) == 12
    torch.testing.assert_close(logits(adapter), logits(core.model), atol=0, rtol=0)


def test_a_full_fine_tune_is_whole_and_has_no_adapter(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    model = load_policy(str(tiny_checkpoint))
    tok = load_tokenizer(str(tiny_checkpoint))
    core = TrainerCore(
        model, TrainerConfig(lr=5e-2), SAMPLING, vocab_size=len(tok), pad_id=0, total_steps=5
    )
    train(core, tiny_checkpoint, 1)
    writer = CheckpointWriter(sharded=False)
    writer.start(core, tmp_path / "trainer")
    asyncio.run(writer.wait())
    policy = trained_policy(tmp_path / "trainer", str(tiny_checkpoint), LoraConfig())
    torch.testing.assert_close(logits(policy), logits(core.model), atol=0, rtol=0)
    with pytest.raises(ValueError, match=r"^this run trained every weight \(trainer.lora.rank 0\)"):
        trained_adapter(tmp_path / "trainer", str(tiny_checkpoint), LoraConfig())


def test_a_directory_without_a_trainer_checkpoint_is_refused(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    with pytest.raises(FileNotFoundError, match="is not a trainer checkpoint"):
        trained_policy(tmp_path, str(tiny_checkpoint), LORA)
