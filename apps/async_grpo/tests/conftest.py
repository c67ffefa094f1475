"""Shared fixtures: one tiny random-init Qwen2 checkpoint written with `save_pretrained`."""

from pathlib import Path

import pytest
from async_grpo.model import ArchSpec, write_random_checkpoint
from async_grpo.tasks import corpus_for

TEST_ARCH = ArchSpec(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-qwen2")
    return write_random_checkpoint(path, TEST_ARCH, corpus_for("count", 1, 6), seed=0)
