"""The tiny checkpoint goes through save_pretrained / from_pretrained like a real one."""

from pathlib import Path

import pytest
import torch
from async_grpo.model.arch import QWEN25_05B_ARCH, ArchSpec
from async_grpo.model.policy import (
    load_policy,
    load_tokenizer,
    qwen2_config,
    write_random_checkpoint,
)
from async_grpo.model.tokenizer import build_tokenizer
from transformers import Qwen2ForCausalLM


def test_checkpoint_round_trip(tiny_checkpoint: Path) -> None:
    assert (tiny_checkpoint / "config.json").is_file()
    assert (tiny_checkpoint / "tokenizer.json").is_file()
    model = load_policy(str(tiny_checkpoint))
    tok = load_tokenizer(str(tiny_checkpoint))
    assert isinstance(model, Qwen2ForCausalLM)
    assert model.config.vocab_size == len(tok)
    assert model.config.eos_token_id == tok.eos_token_id
    ids = tok("count to 5: 1 2 3 4 5", add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == "count to 5 : 1 2 3 4 5"
    assert tok.unk_token_id not in ids
    out = model(input_ids=torch.tensor([ids])).logits
    assert out.shape == (1, len(ids), len(tok))


def test_same_seed_same_weights(tmp_path: Path) -> None:
    arch = ArchSpec(16, 32, 1, 2, 1, 32)
    a = write_random_checkpoint(tmp_path / "a", arch, ["count to 3: 1 2 3"], seed=5)
    b = write_random_checkpoint(tmp_path / "b", arch, ["count to 3: 1 2 3"], seed=5)
    wa, wb = load_policy(str(a)).state_dict(), load_policy(str(b)).state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_local_tokenizer_chat_template_passes_the_message_through(tiny_checkpoint: Path) -> None:
    # The qwen2.5-0.5b preset applies a chat template; with --model.random_weights its
    # checkpoint's tokenizer is a locally built one, loaded back from disk like this.
    tok = load_tokenizer(str(tiny_checkpoint))
    chat = [{"role": "user", "content": "count to 3:"}]
    text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert text == "count to 3:"


def test_tokenizer_unknown_word_maps_to_unk() -> None:
    tok = build_tokenizer(["count to 3: 1 2 3"])
    assert tok("hello", add_special_tokens=False)["input_ids"] == [tok.unk_token_id]


def test_qwen_arch_values_give_the_real_parameter_count() -> None:
    tok = build_tokenizer(["a b"])
    config = qwen2_config(QWEN25_05B_ARCH, tok)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    n = sum(p.numel() for p in model.parameters())
    assert 490e6 < n < 500e6  # Qwen2.5-0.5B has 494M parameters (tied embeddings)


def test_vocab_smaller_than_tokenizer_is_an_error() -> None:
    tok = build_tokenizer(["a b c d e"])
    with pytest.raises(ValueError, match="smaller than the tokenizer"):
        qwen2_config(ArchSpec(16, 32, 1, 2, 1, 32, vocab_size=3), tok)
