"""Qwen2-architecture policies: the tiny random-init checkpoint and loading any checkpoint.

Every process loads the policy with `from_pretrained` from a directory, whether it holds a
real checkpoint or the tiny one this module writes, so the tiny preset exercises exactly the
code path a real model takes.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.utils import logging as hf_logging

from async_grpo.model.arch import ArchSpec
from async_grpo.model.tokenizer import build_tokenizer, save_tokenizer

# Per-file progress bars from every process would drown the training log.
hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]


def qwen2_config(arch: ArchSpec, tokenizer: PreTrainedTokenizerBase | None) -> Qwen2Config:
    """A `Qwen2Config` for `arch`, with special token ids taken from `tokenizer` (None: the
    layers alone, for checks made before a tokenizer exists; a vocabulary of 1 unless
    `arch` sets one)."""
    size = len(tokenizer) if tokenizer is not None else 1
    vocab = arch.vocab_size if arch.vocab_size is not None else size
    if vocab < size:
        raise ValueError(f"vocab_size {vocab} is smaller than the tokenizer ({size})")
    return Qwen2Config(
        vocab_size=vocab,
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_hidden_layers,
        num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_key_value_heads,
        max_position_embeddings=arch.max_position_embeddings,
        tie_word_embeddings=arch.tie_word_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": arch.rope_theta},
        rms_norm_eps=arch.rms_norm_eps,
        pad_token_id=tokenizer.pad_token_id if tokenizer is not None else None,
        eos_token_id=tokenizer.eos_token_id if tokenizer is not None else None,
        bos_token_id=None,
    )


def write_random_checkpoint(
    path: Path, arch: ArchSpec, corpus: list[str] | None, seed: int, tokenizer_from: str = ""
) -> Path:
    """Writes a random-init Qwen2 model and its tokenizer to `path` with `save_pretrained`.

    The tokenizer is trained on `corpus`, or loaded from `tokenizer_from` (a local directory)
    when that is given. Returns `path`.
    """
    if tokenizer_from:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_from)
        tokenizer.save_pretrained(str(path))
    else:
        if not corpus:
            raise ValueError("write_random_checkpoint needs a corpus to train a tokenizer on")
        fast = build_tokenizer(corpus)
        save_tokenizer(fast, path)
        tokenizer = fast
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(qwen2_config(arch, tokenizer))
    model.save_pretrained(str(path))
    return path


def built_checkpoint(out_dir: Path, arch: str, seed: int) -> Path:
    """Where a run in `out_dir` writes the random checkpoint of `arch` it builds
    (`write_random_checkpoint`), and where its export finds the architecture again."""
    return out_dir / f"checkpoint-{arch}-seed{seed}"


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """Loads the tokenizer in `path` (a directory written by `save_pretrained`, or a hub id).

    A directory with a `tokenizer.json` is loaded as exactly that pipeline: `AutoTokenizer`
    would pick the class registered for the model type (`Qwen2Tokenizer` for a Qwen2
    config), which rebuilds its own byte-level decoder and so joins our word-level tokens
    without spaces.
    """
    tokenizer: PreTrainedTokenizerBase
    if (Path(path) / "tokenizer.json").is_file():
        tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
    else:
        tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def torch_device(device: str) -> torch.device:
    """ "cuda" (this process's first visible GPU: the device map pins each process to its
    own), "cpu", or "auto" (CUDA when this process sees a GPU)."""
    if device not in ("auto", "cuda", "cpu"):
        raise ValueError(f"device must be auto, cuda or cpu, got {device!r}")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def torch_dtype(name: str) -> torch.dtype:
    """A config's dtype name ("float32", "bfloat16") as a torch dtype."""
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    if name not in dtypes:
        raise ValueError(f"dtype must be one of {sorted(dtypes)}, got {name!r}")
    return dtypes[name]


def load_policy(path: str, dtype: torch.dtype = torch.float32) -> PreTrainedModel:
    """Loads a causal LM from `path` with `from_pretrained`, in eval mode."""
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model.train(False)
    return model
