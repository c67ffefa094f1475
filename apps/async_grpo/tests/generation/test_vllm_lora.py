"""LoRA adapters in the vLLM engine (merged into its weights at every version): a version is
the adapter's tensors alone, and what the replica then samples is base + adapter, to the
trainer's float32 recomputation through peft.

Needs vLLM (`uv sync --extra vllm`; the nox session `vllm` runs this module); skipped
without it.
"""

from __future__ import annotations

import importlib
import itertools
import os
from pathlib import Path

import pytest
import torch
from async_grpo.actors.generator import Generator
from async_grpo.config.presets import TINY_ARCH
from async_grpo.config.schema import GeneratorConfig, LoraConfig, ModelConfig, SamplingConfig
from async_grpo.generation.decoding import Completion
from async_grpo.generation.episodes import to_episodes
from async_grpo.grpo.batching import pack, sequence_logprobs
from async_grpo.model.lora import adapter_state, add_adapters
from async_grpo.model.policy import load_policy, load_tokenizer, write_random_checkpoint
from monarch.actor import this_host
from rdma_tensor import Publisher
from transformers import PreTrainedModel

if os.environ.get("ASYNC_GRPO_REQUIRE_VLLM") == "1":  # the nox session: fail, never skip
    importlib.import_module("vllm")
else:
    pytest.importorskip("vllm", reason="needs vLLM: uv sync --extra vllm")

SAMPLING = SamplingConfig(group_size=4, max_new_tokens=6, temperature=0.7, top_p=0.9)
PROMPTS = ["count to 1 :", "count to 3 : 1 2", "count to 6 :"]
LORA = LoraConfig(rank=4, alpha=8)


def gap(model: PreTrainedModel, checkpoint: Path, groups: list[list[Completion]]) -> float:
    """Largest |trainer log-prob - recorded behavior log-prob| over every response token."""
    tok = load_tokenizer(str(checkpoint))
    episodes = to_episodes(groups, [0.0] * sum(map(len, groups)), itertools.count())
    batch = pack(episodes, pad_id=tok.pad_token_id)
    with torch.no_grad():
        lp = sequence_logprobs(model, batch, SAMPLING.temperature, SAMPLING.top_p, len(tok))
    return float((lp - batch.behavior_logprobs)[batch.response_mask.bool()].abs().max())


async def test_a_version_is_the_adapter_and_samples_base_plus_adapter(tmp_path: Path) -> None:
    # The tiny preset's architecture: vLLM's CPU attention needs a head size of 32 or more.
    words = [f"count to {n} : " + " ".join(str(i) for i in range(1, n + 1)) for n in range(1, 7)]
    checkpoint = write_random_checkpoint(tmp_path, TINY_ARCH, words, seed=0)
    torch.manual_seed(1)
    trained = load_policy(str(checkpoint))
    wrapped = add_adapters(trained, LORA)
    adapter = adapter_state(wrapped)
    with torch.no_grad():
        for tensor in adapter.values():
            tensor.normal_(0, 0.2)  # a trained adapter: B far from its initial zero
    config = GeneratorConfig(replicas=1, engine="vllm", kv_cache_gib=0.0625, kv_block_tokens=32)
    procs = this_host().spawn_procs(per_host={"procs": 1})
    publisher = Publisher()
    try:
        model = ModelConfig(dtype="float32")
        gen = procs.spawn(
            "generator", Generator, str(checkpoint), model, SAMPLING, 0, config, lora=LORA
        )
        update = publisher.publish(adapter, 1)
        assert update.nbytes == sum(t.numel() * t.element_size() for t in adapter.values())
        assert (await gen.update_weights.call_one(update)).version == 1
        groups = await gen.generate.call_one(PROMPTS)
        assert {c.policy_version for g in groups for c in g} == {1}
        assert gap(trained, checkpoint, groups) <= 1e-4
        # ... and not the base model's: the check tells the two apart.
        assert gap(load_policy(str(checkpoint)), checkpoint, groups) > 1e-2
    finally:
        publisher.close()
        await procs.stop()
