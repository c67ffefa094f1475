"""A real checkpoint written without Monarch: the trainer's part by `trainer_state` from a
`TrainerCore` in this process, the rest by `checkpointing.write_files`, completed by
`disk.finish`, exactly as a run writes them. For the tests of `--resume`'s checks,
which must not spawn anything."""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch
from async_grpo.checkpoint import disk
from async_grpo.checkpoint.trainer_state import CheckpointWriter
from async_grpo.config.schema import RunConfig
from async_grpo.controller.cut import HOLDS, ControllerState, write_files
from async_grpo.controller.ledger import PromptLedger
from async_grpo.grpo.step import TrainerCore
from async_grpo.launch.spawn import buffer_config
from async_grpo.model.lora import add_adapters
from async_grpo.model.policy import load_policy
from async_grpo.observability.metrics import RunMetrics
from replay_buffer import ReplayBuffer


def make_checkpoint(cfg: RunConfig, version: int, *, moved: float = 0.0) -> Path:
    """Checkpoint `version` of a run with `cfg` (whose `model.path` must be a checkpoint),
    in `cfg.out_dir`. `moved`: the trained weights (every one, or with `trainer.lora` the
    adapters) are the model's plus that much Gaussian noise (seeded by `version`), so they
    differ from what `model.path` holds."""
    model = load_policy(cfg.model.path, torch.float32)
    if cfg.trainer.lora.enabled:
        add_adapters(model, cfg.trainer.lora)
    if moved:
        torch.manual_seed(version)
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:
                    p.add_(moved * torch.randn_like(p))
    core = TrainerCore(model, cfg.trainer, cfg.sampling, vocab_size=16, pad_id=0, total_steps=9)
    core.version = version
    partial = disk.begin(Path(cfg.out_dir), version)
    writer = CheckpointWriter(sharded=False)
    writer.start(core, partial / "trainer")
    asyncio.run(writer.wait())
    ledger = PromptLedger(cfg.seed, cfg.generator.prompts_per_call, None)
    state = ControllerState(
        version, ledger.state({}), RunMetrics(cfg.window).snapshot(), None, None
    )
    buffer = ReplayBuffer(buffer_config(cfg)).state_dict()
    write_files(partial, cfg, state, buffer, metrics_rows="", prompt_rows="")
    return disk.finish(partial, version, 1, HOLDS)


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file below `root`: (size, mtime in ns), to show that nothing changed."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }
