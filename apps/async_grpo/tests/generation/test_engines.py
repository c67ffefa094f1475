"""Choosing the generation engine: what the controller checks before spawning anything.

Runs with or without vLLM installed (the engine itself is tested in test_vllm_engine.py).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from async_grpo.config.args import apply_overrides
from async_grpo.config.presets import tiny
from async_grpo.config.schema import ConfigError
from async_grpo.generation.engines import check_engine, make_engine
from async_grpo.launch.prepare import prepare


def test_check_engine_names_the_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    assert check_engine("hf", replicas=2, kv_cache_gib=1e9, on_gpu=False) is None
    problem = check_engine("sglang", replicas=1, kv_cache_gib=1.0, on_gpu=False)
    assert problem == "unknown engine 'sglang'; known: hf, vllm"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    problem = check_engine("vllm", replicas=1, kv_cache_gib=1.0, on_gpu=False)
    assert problem is not None
    assert problem.startswith("vLLM is not installed; install it with `uv sync --extra vllm`")


def test_a_kv_cache_larger_than_memory_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    assert check_engine("vllm", replicas=2, kv_cache_gib=0.0625, on_gpu=False) is None
    problem = check_engine("vllm", replicas=4, kv_cache_gib=100_000.0, on_gpu=False)
    assert problem is not None
    assert problem.startswith("the KV cache of 4 replica(s) x 100000 GiB = 400000 GiB")
    # On a GPU the reservation is GPU memory: vLLM checks it as the replica starts.
    assert check_engine("vllm", replicas=4, kv_cache_gib=100_000.0, on_gpu=True) is None


def test_make_engine_refuses_an_unknown_engine() -> None:
    with pytest.raises(ValueError, match="unknown generation engine 'sglang'"):
        make_engine("sglang", "/nonexistent", tiny().model, tiny().sampling, 0)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_prepare_refuses_vllm_when_it_is_not_installed(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cfg = apply_overrides(tiny(), {"generator.engine": "vllm", "out_dir": str(out)})
    with pytest.raises(ConfigError, match=r"generator.engine vllm: vLLM is not installed"):
        prepare(cfg)
    assert not out.exists()  # refused before anything was written


def test_prepare_refuses_tensor_parallel_without_vllm_on_cuda(tmp_path: Path) -> None:
    cfg = apply_overrides(tiny(), {"generator.tensor_parallel": "2", "out_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"generator\.tensor_parallel 2 needs"):
        prepare(cfg)
