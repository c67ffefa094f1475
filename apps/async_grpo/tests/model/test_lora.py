"""LoRA adapters on a real tiny Qwen2 (built from a config) with real peft: what is frozen,
what the adapter's tensors are called and hold, and which target names are refused."""

from pathlib import Path

import pytest
import torch
from async_grpo.config.schema import LoraConfig
from async_grpo.model.lora import (
    adapter_state,
    add_adapters,
    check_targets,
    linear_module_names,
    merged_weights,
    train_adapter_dropout,
)
from async_grpo.model.policy import load_policy
from safetensors.torch import load_file
from transformers import AutoConfig

IDS = torch.tensor([[3, 4, 5, 6, 7]])


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = model(input_ids=IDS).logits
    return out


def test_only_the_adapters_train_and_they_start_as_the_base_model(tiny_checkpoint: Path) -> None:
    model = load_policy(str(tiny_checkpoint))
    before = logits(model)
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    wrapped = add_adapters(model, LoraConfig(rank=4))
    assert wrapped.get_base_model() is model
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    # 7 projections x 2 layers x (A, B)
    assert len(trainable) == 28
    assert all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # B is zero: the wrapped model computes exactly what the base did.
    assert torch.equal(logits(model), before)
    frozen = {
        n.replace(".base_layer", ""): p for n, p in model.named_parameters() if "lora_" not in n
    }
    assert frozen.keys() == base.keys()
    assert not any(p.requires_grad for p in frozen.values())
    assert all(torch.equal(frozen[n], base[n]) for n in base)


def test_the_adapter_state_is_what_an_adapter_file_holds_and_writes_into_the_model(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    wrapped = add_adapters(load_policy(str(tiny_checkpoint)), LoraConfig(rank=4, alpha=8))
    state = adapter_state(wrapped)
    wrapped.save_pretrained(str(tmp_path))
    saved = load_file(str(tmp_path / "adapter_model.safetensors"))
    assert set(state) == set(saved)
    assert all(".default." not in n for n in state)
    before = logits(wrapped.get_base_model())
    with torch.no_grad():
        for name, tensor in state.items():
            if ".lora_B." in name:
                tensor.fill_(0.01)
    assert not torch.equal(logits(wrapped.get_base_model()), before)


def test_target_modules_may_be_dotted_suffixes(tiny_checkpoint: Path) -> None:
    config = AutoConfig.from_pretrained(str(tiny_checkpoint))
    check_targets(config, LoraConfig(rank=2, target_modules="self_attn.q_proj, v_proj"))
    wrapped = add_adapters(
        load_policy(str(tiny_checkpoint)), LoraConfig(rank=2, target_modules="self_attn.q_proj")
    )
    assert {n.split(".")[-3] for n in adapter_state(wrapped)} == {"q_proj"}


@pytest.mark.parametrize(
    ("targets", "message"),
    [
        (
            "q_proj,qkv_proj",
            "trainer.lora.target_modules: qkv_proj is not a linear module of this qwen2 model; "
            "its linear modules: down_proj, gate_proj, k_proj, lm_head, o_proj, q_proj, "
            "up_proj, v_proj",
        ),
        ("mlp,attn", "trainer.lora.target_modules: mlp, attn are not linear modules of"),
        (" , ", "trainer.lora.target_modules is empty; name at least one module"),
    ],
)
def test_an_unknown_target_is_one_line(tiny_checkpoint: Path, targets: str, message: str) -> None:
    config = AutoConfig.from_pretrained(str(tiny_checkpoint))
    with pytest.raises(ValueError, match=r"^trainer\.lora") as raised:
        check_targets(config, LoraConfig(rank=2, target_modules=targets))
    assert str(raised.value).startswith(message)
    assert "\n" not in str(raised.value)


def test_module_names_come_from_the_config_alone(tiny_checkpoint: Path) -> None:
    config = AutoConfig.from_pretrained(str(tiny_checkpoint))
    names = linear_module_names(config)
    assert "model.layers.1.mlp.down_proj" in names
    assert "lm_head" in names
    assert len(names) == 2 * 7 + 1


def test_adapter_dropout_runs_in_an_eval_model_and_nothing_else_does(
    tiny_checkpoint: Path,
) -> None:
    model = load_policy(str(tiny_checkpoint))
    model.config.attention_dropout = 0.5
    add_adapters(model, LoraConfig(rank=4, dropout=0.5))
    model.train(False)
    train_adapter_dropout(model)
    training = {n for n, m in model.named_modules() if m.training}
    assert training
    assert all(".lora_dropout" in n for n in training)


def test_merged_weights_are_what_peft_merges(tiny_checkpoint: Path) -> None:
    lora = LoraConfig(rank=4, alpha=12, target_modules="q_proj,down_proj")
    wrapped = add_adapters(load_policy(str(tiny_checkpoint)), lora)
    with torch.no_grad():
        for tensor in adapter_state(wrapped).values():
            tensor.normal_(0, 0.1)  # B too: a trained adapter, not the zero it starts as
    base = load_policy(str(tiny_checkpoint)).state_dict()
    merged = merged_weights(base, adapter_state(wrapped), lora)
    expected = wrapped.merge_and_unload().state_dict()
    assert merged.keys() == base.keys()
    for name, tensor in expected.items():
        torch.testing.assert_close(merged[name], tensor, atol=1e-6, rtol=1e-6)
    assert not torch.equal(
        merged["model.layers.0.mlp.down_proj.weight"], base["model.layers.0.mlp.down_proj.weight"]
    )
    assert (
        merged["model.layers.0.self_attn.k_proj.weight"]
        is base["model.layers.0.self_attn.k_proj.weight"]
    )
    with pytest.raises(ValueError, match="adapts no weight of the base model"):
        merged_weights(base, {"base_model.model.model.nope.lora_A.weight": torch.zeros(1)}, lora)
