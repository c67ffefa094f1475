"""`train.run` holds the controller's thread to one torch thread while the run lasts (its
tensor work is small, and the cores belong to the generators and the trainer) and puts the
setting back after, also when the run fails."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from async_grpo.train import _one_torch_thread


@pytest.fixture
def two_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("two_threads")
def test_one_thread_while_the_run_lasts_then_the_setting_back() -> None:
    with _one_torch_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2


@pytest.mark.usefixtures("two_threads")
def test_the_setting_comes_back_when_the_run_fails() -> None:
    with pytest.raises(RuntimeError, match="a step failed"), _one_torch_thread():
        raise RuntimeError("a step failed")
    assert torch.get_num_threads() == 2
