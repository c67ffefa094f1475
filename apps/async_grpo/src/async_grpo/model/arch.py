"""The Qwen2 architecture numbers presets build models from, kept apart from `model.policy`
so that reading a preset does not import `transformers` (seconds in every command's
start-up, `--help` included)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ArchSpec:
    """The Qwen2 architecture numbers a preset builds from (no checkpoint needed)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    vocab_size: int | None = None  # None: the tokenizer's length
    tie_word_embeddings: bool = True
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6


# Values from Qwen/Qwen2.5-0.5B-Instruct's config.json, so a random-weights model has the
# real parameter count and layer shapes without fetching anything.
QWEN25_05B_ARCH = ArchSpec(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    vocab_size=151936,
    tie_word_embeddings=True,
    rope_theta=1000000.0,
)
