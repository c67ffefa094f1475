"""Shared fixtures: one tiny random-init Qwen2 checkpoint written with `save_pretrained`; and
a failed test's report carries the stacks of its run's processes that crashed."""

import os
import sys
from collections.abc import Generator
from pathlib import Path

import pytest
from async_grpo.model.arch import ArchSpec
from async_grpo.model.policy import write_random_checkpoint
from async_grpo.observability.crashes import stacks_under
from async_grpo.tasks.prompts import corpus_for

# Monarch notices a dead process at its supervision poll: 1 s instead of the default 10 s
# keeps the tests that kill processes short. Set before any test starts Monarch here.
os.environ.setdefault("HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY", "1s")

# Test helpers (`jobs`, `synthetic_runs`) live beside this file.
sys.path.insert(0, os.path.dirname(__file__))

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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test whose run's processes crashed shows where: the stacks each wrote into
    `<tmp_path>/.../crashes/` (`observability.crashes`) go into the failure's report, which
    outlives the test's temporary folder (a CI log keeps only what pytest prints)."""
    report = yield
    tmp = getattr(item, "funcargs", {}).get("tmp_path")
    if report.failed and call.when == "call" and isinstance(tmp, Path):
        for crash in stacks_under(tmp):
            text = crash.path.read_text(errors="replace")
            report.sections.append((f"stacks of a crashed process: {crash.path}", text))
    return report
