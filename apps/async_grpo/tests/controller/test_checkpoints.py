"""A checkpoint whose trainer dies while it is written (`controller/checkpoints.py`): the
trainer's part is written by a real `CheckpointWriter` (DCP) from a `TrainerCore` in this
process; the trainer's confirmation (`saved`) is what the fake withholds. Without Monarch.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from async_grpo.checkpoint import disk
from async_grpo.checkpoint.trainer_state import CheckpointWriter
from async_grpo.config.args import apply_overrides
from async_grpo.config.presets import tiny
from async_grpo.config.schema import RunConfig
from async_grpo.controller import checkpoints as checkpoints_module
from async_grpo.controller.checkpoints import Checkpoints, CutSource
from async_grpo.controller.cut import ControllerState, read_cut
from async_grpo.controller.ledger import LedgerState, PromptLedger
from async_grpo.controller.staleness import StalenessGate
from async_grpo.grpo.step import TrainerCore
from async_grpo.launch.spawn import buffer_config
from async_grpo.model.policy import load_policy
from async_grpo.observability.metrics import RunMetrics
from async_grpo.observability.sink import MetricsSink
from replay_buffer import BufferSnapshot, ReplayBuffer


class Trainer:
    """A trainer whose `save` really writes (or, `writes=False`, never finishes writing)
    and whose `saved` answers, hangs or fails as its `confirm` says."""

    def __init__(self, cfg: RunConfig, confirm: str, *, writes: bool = True) -> None:
        model = load_policy(cfg.model.path, torch.float32)
        self.core = TrainerCore(
            model, cfg.trainer, cfg.sampling, vocab_size=16, pad_id=0, total_steps=9
        )
        self.writer = CheckpointWriter(sharded=False)
        self.confirm, self.writes = confirm, writes

    async def save(self, path: Path) -> float:
        if not self.writes:  # died before its write ended: nothing but the directory
            await asyncio.to_thread(path.mkdir, parents=True)
            return 0.0
        return self.writer.start(self.core, path)

    async def saved(self) -> None:
        if self.writes:
            await self.writer.wait()
        if self.confirm == "hangs":
            await asyncio.Event().wait()  # a hung trainer answers nothing
        if self.confirm == "dies":
            raise RuntimeError("the trainer's process died")


class Buffer:
    def __init__(self, cfg: RunConfig) -> None:
        self.state = ReplayBuffer(buffer_config(cfg)).state_dict()

    def endpoint(self, _: Any) -> Buffer:
        return self

    async def route(self) -> BufferSnapshot:
        return BufferSnapshot(self.state, ())


@dataclasses.dataclass
class Components:
    buffer: Buffer
    trainer: Trainer


@dataclasses.dataclass
class Source:
    """What `Checkpoints.take` reads a cut from (the controller's `Job`)."""

    cfg: RunConfig
    components: Components
    ledger: PromptLedger
    gate: StalenessGate
    sink: MetricsSink

    def controller_state(self, version: int, ledger: LedgerState) -> ControllerState:
        return ControllerState(version, ledger, RunMetrics(self.cfg.window).snapshot(), None, None)


@pytest.fixture
def cfg(tmp_path: Path, tiny_checkpoint: Path) -> RunConfig:
    return apply_overrides(
        tiny(), {"model.path": str(tiny_checkpoint), "out_dir": str(tmp_path / "run")}
    )


def source(cfg: RunConfig, trainer: Trainer) -> CutSource:
    made = Source(
        cfg,
        Components(Buffer(cfg), trainer),
        PromptLedger(cfg.seed, cfg.generator.prompts_per_call, None),
        StalenessGate(1, 8),
        MetricsSink(Path(cfg.out_dir)),
    )
    return cast(CutSource, made)  # the fakes answer what `take` and `_write` call


async def take_then_lose_the_trainer(cfg: RunConfig, trainer: Trainer) -> Checkpoints:
    """Takes checkpoint 2, waits until its trainer part is on disk if it is ever to be,
    then does what a trainer death does: `abandon`."""
    checkpoints = Checkpoints(cfg, None, log=lambda _: None)
    await checkpoints.take(source(cfg, trainer), 2)
    if trainer.writes:
        await trainer.writer.wait()
    await checkpoints.abandon()
    return checkpoints


@pytest.mark.parametrize("confirm", ["hangs", "dies"])
def test_a_trainer_lost_after_its_write_leaves_a_complete_checkpoint(
    cfg: RunConfig, confirm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints_module, "TRAINER_FILES_POLL_S", 0.05)
    checkpoints = asyncio.run(take_then_lose_the_trainer(cfg, Trainer(cfg, confirm)))
    (written,) = disk.complete(Path(cfg.out_dir))
    assert checkpoints.newest == written
    assert written.name == "step-000002"
    assert read_cut(written, buffer_config(cfg)).version == 2  # every file checks out
    assert checkpoints.taken == 2  # the run is back at it: not taken again


def test_a_trainer_lost_before_its_write_ended_leaves_nothing(cfg: RunConfig) -> None:
    trainer = Trainer(cfg, "hangs", writes=False)
    checkpoints = asyncio.run(take_then_lose_the_trainer(cfg, trainer))
    assert checkpoints.newest is None
    assert checkpoints.taken is None
    root = disk.checkpoints_dir(Path(cfg.out_dir))
    assert list(root.iterdir()) == []  # the partial directory is gone too


def test_a_trainer_that_confirms_its_write(cfg: RunConfig) -> None:
    async def take_and_finish() -> Checkpoints:
        checkpoints = Checkpoints(cfg, None, log=lambda _: None)
        await checkpoints.take(source(cfg, Trainer(cfg, "answers")), 2)
        await checkpoints.finish()
        return checkpoints

    checkpoints = asyncio.run(take_and_finish())
    assert checkpoints.newest is not None
    assert checkpoints.newest.name == "step-000002"


def test_a_trainer_lost_after_the_checkpoint_completed_keeps_it_taken(cfg: RunConfig) -> None:
    # The write ended before the death: nothing is dropped, and the run (rolled back to this
    # checkpoint) does not take it again.
    async def take_finish_then_lose() -> Checkpoints:
        checkpoints = Checkpoints(cfg, None, log=lambda _: None)
        await checkpoints.take(source(cfg, Trainer(cfg, "answers")), 2)
        await checkpoints.finish()
        await checkpoints.abandon()
        return checkpoints

    checkpoints = asyncio.run(take_finish_then_lose())
    assert checkpoints.newest is not None
    assert checkpoints.newest.name == "step-000002"
    assert checkpoints.taken == 2
