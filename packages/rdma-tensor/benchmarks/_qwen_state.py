"""The state dict `gpu_weight_sync.py` moves: the names and shapes of a Qwen2 model (from
transformers on the meta device, or written out by hand without it), as views of one flat
buffer filled with seeded random values."""

from __future__ import annotations

import importlib
import math
import sys
from typing import Any

import cloudpickle  # type: ignore[import-untyped]
import torch

# The benchmark's actors use these functions in the Monarch workers, which cannot import
# this script's folder: they travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

Shapes = list[tuple[str, tuple[int, ...]]]

# The dimensions of Qwen/Qwen2.5-0.5B-Instruct's config.json (as async_grpo.model.arch's
# QWEN25_05B_ARCH); `tiny` is a CPU-sized Qwen2 for the rehearsal.
ARCHS: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": {
        "vocab_size": 151936,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
        "rope_theta": 1000000.0,
    },
    "tiny": {
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "tie_word_embeddings": True,
    },
}
DTYPE = torch.bfloat16


def shapes_by_hand(arch: dict[str, Any]) -> Shapes:
    """The names and shapes of `Qwen2ForCausalLM(Qwen2Config(**arch)).state_dict()`, written
    out (used when transformers is not installed, e.g. in rdma-tensor's own environment)."""
    h, inter = arch["hidden_size"], arch["intermediate_size"]
    kv = h // arch["num_attention_heads"] * arch["num_key_value_heads"]
    out: Shapes = [("model.embed_tokens.weight", (arch["vocab_size"], h))]
    for i in range(arch["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [
            (p + "self_attn.q_proj.weight", (h, h)),
            (p + "self_attn.q_proj.bias", (h,)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.k_proj.bias", (kv,)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.bias", (kv,)),
            (p + "self_attn.o_proj.weight", (h, h)),
            (p + "mlp.gate_proj.weight", (inter, h)),
            (p + "mlp.up_proj.weight", (inter, h)),
            (p + "mlp.down_proj.weight", (h, inter)),
            (p + "input_layernorm.weight", (h,)),
            (p + "post_attention_layernorm.weight", (h,)),
        ]
    return [*out, ("model.norm.weight", (h,)), ("lm_head.weight", (arch["vocab_size"], h))]


def qwen2_shapes(arch: dict[str, Any]) -> tuple[Shapes, list[str], str]:
    """(names and shapes of the state dict, the names that repeat a tied tensor, where the
    shapes came from). Built from a transformers `Qwen2Config` on the meta device (no memory,
    no download) when transformers is installed."""
    by_hand = shapes_by_hand(arch)
    tied = ["lm_head.weight"] if arch.get("tie_word_embeddings") else []
    try:
        transformers = importlib.import_module("transformers")
    except ImportError:
        return by_hand, tied, "written out by hand (transformers is not installed)"
    with torch.device("meta"):
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**arch))
    shapes = [(n, tuple(t.shape)) for n, t in model.state_dict().items()]
    unique = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    tied = [n for n, _ in shapes if n not in unique]
    source = f"transformers {transformers.__version__} Qwen2Config"
    if shapes != by_hand:
        source += " (differs from the hand-written Qwen2 layout in _qwen_state.py)"
    return shapes, tied, source


def flat_views(shapes: Shapes, device: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One flat buffer and the state dict as views of it (contiguous, in order)."""
    total = sum(math.prod(s) for _, s in shapes)
    flat = torch.empty(total, dtype=DTYPE, device=device)
    state, offset = {}, 0
    for name, shape in shapes:
        n = math.prod(shape)
        state[name] = flat[offset : offset + n].view(shape)
        offset += n
    return flat, state


def fill(flat: torch.Tensor, seed: int) -> None:
    """Seeded random values, the same in any process on the same kind of device."""
    gen = torch.Generator(device=flat.device).manual_seed(seed)
    chunk = 1 << 26  # bounds the float32 temporary
    for start in range(0, flat.numel(), chunk):
        part = flat[start : start + chunk]
        part.copy_(torch.randn(part.numel(), generator=gen, device=flat.device))
