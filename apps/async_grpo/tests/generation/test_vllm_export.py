"""An export (`async-grpo export`) loads in vLLM: the vLLM engine in a real generator replica
started on the exported directory samples from the checkpoint's weights, not the base
model's.

Needs vLLM (`uv sync --extra vllm`; the nox session `vllm` runs this module); skipped
without it.
"""

from __future__ import annotations

import asyncio
import importlib
import itertools
import os
from pathlib import Path

import pytest
import torch
from async_grpo.actors.generator import Generator
from async_grpo.checkpoint.export import export
from async_grpo.config.args import apply_overrides
from async_grpo.config.presets import TINY_ARCH, tiny
from async_grpo.config.schema import GeneratorConfig, ModelConfig, SamplingConfig
from async_grpo.generation.decoding import Completion
from async_grpo.generation.episodes import to_episodes
from async_grpo.grpo.batching import pack, sequence_logprobs
from async_grpo.model.policy import load_policy, load_tokenizer, write_random_checkpoint
from made_checkpoints import make_checkpoint
from monarch.actor import this_host

if os.environ.get("ASYNC_GRPO_REQUIRE_VLLM") == "1":  # the nox session: fail, never skip
    importlib.import_module("vllm")
else:
    pytest.importorskip("vllm", reason="needs vLLM: uv sync --extra vllm")

SAMPLING = SamplingConfig(group_size=4, max_new_tokens=6, temperature=1.0, top_p=1.0)
PROMPTS = ["count to 1 :", "count to 3 : 1 2", "count to 6 :"]


def max_logprob_gap(model_dir: Path, groups: list[list[Completion]]) -> float:
    """The largest difference between the log-probs the engine recorded and those the
    model in `model_dir` gives the same tokens (the trainer's recomputation)."""
    model, tok = load_policy(str(model_dir)), load_tokenizer(str(model_dir))
    episodes = to_episodes(groups, [0.0] * sum(map(len, groups)), itertools.count())
    batch = pack(episodes, pad_id=tok.pad_token_id)
    with torch.no_grad():
        lp = sequence_logprobs(model, batch, SAMPLING.temperature, SAMPLING.top_p, len(tok))
    return (lp - batch.behavior_logprobs)[batch.response_mask.bool()].abs().max().item()


def test_an_export_loads_in_the_vllm_engine(tmp_path: Path) -> None:
    # The tiny preset's architecture: vLLM's CPU attention needs a head size of 32 or more.
    words = [f"count to {n} : " + " ".join(str(i) for i in range(1, n + 1)) for n in range(1, 7)]
    base = write_random_checkpoint(tmp_path / "base", TINY_ARCH, words, seed=0)
    cfg = apply_overrides(tiny(), {"model.path": str(base), "out_dir": str(tmp_path / "run")})
    checkpoint = make_checkpoint(cfg, 7, moved=0.3)
    exported = export(checkpoint, tmp_path / "exported")
    assert exported.version == 7

    async def sample() -> list[list[Completion]]:
        procs = this_host().spawn_procs(per_host={"procs": 1})
        try:
            vllm = GeneratorConfig(replicas=1, engine="vllm", kv_cache_gib=0.0625)
            model = ModelConfig(dtype="float32")
            where = str(tmp_path / "exported")
            gen = procs.spawn("generator", Generator, where, model, SAMPLING, 0, vllm)
            groups: list[list[Completion]] = await gen.generate.call_one(PROMPTS)
            return groups
        finally:
            await procs.stop()

    groups = asyncio.run(sample())
    assert [len(g) for g in groups] == [SAMPLING.group_size] * len(PROMPTS)
    assert max_logprob_gap(tmp_path / "exported", groups) <= 1e-4  # the export's weights
    assert max_logprob_gap(base, groups) > 1e-2  # ... and not the base model's
