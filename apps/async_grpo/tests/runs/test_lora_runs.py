"""Whole runs with LoRA adapters (`--trainer.lora.rank 4`), real Monarch processes: every
step's weight sync moves the adapter's bytes alone, and a sync run with a fixed seed repeats
bit for bit (per-step losses, rewards, prompts trained, the adapters and their AdamW state)
when its controller is SIGKILLed and the run resumed with `--resume`, and when its trainer
is SIGKILLed and restored from the last checkpoint.

A small model (`conftest.TEST_ARCH`), 6 sync steps with a checkpoint every 2.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from async_grpo.actors.trainer import TrainResult
from async_grpo.cli.main import main
from async_grpo.config.args import apply_overrides
from async_grpo.config.presets import tiny
from async_grpo.config.schema import LoraConfig, RunConfig
from async_grpo.launch.prepare import prepare
from async_grpo.launch.spawn import Components
from async_grpo.model.lora import adapter_state, add_adapters
from async_grpo.model.policy import load_policy
from async_grpo.observability.metrics import StepRow
from async_grpo.train import run
from jobs import keeping, rows
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

pytestmark = pytest.mark.slow  # whole runs

STEPS, KILL_AT = 6, 5  # checkpoints at 2, 4, 6: the kill costs step 5
COMPARED = ("version", "loss", "reward_window", "exact_window", "grad_norm", "lr", "entropy")


def options(out: Path, model: Path) -> dict[str, str]:
    return {
        "mode": "sync",
        "steps": str(STEPS),
        "checkpoint.every": "2",
        "eval_every": "0",
        "model.path": str(model),
        "sampling.group_size": "8",
        "trainer.batch_size": "32",
        "trainer.lr": "3e-3",
        "trainer.lora.rank": "4",
        "generator.prompts_per_call": "2",
        "buffer.capacity": "64",
        "window": "32",
        "out_dir": str(out),
    }


def config(out: Path, model: Path) -> RunConfig:
    return apply_overrides(tiny(), options(out, model))


def trained(out: Path) -> list[Any]:
    """Per step: the compared metrics and the prompts it trained on."""
    prompts = [json.loads(x) for x in (out / "trained_prompts.jsonl").read_text().splitlines()]
    return [([r[k] for k in COMPARED], p) for r, p in zip(rows(out), prompts, strict=True)]


def final_state(out: Path) -> dict[str, Any]:
    """The last checkpoint's trainer state (adapters, their AdamW moments, version)."""
    path = out / "final.pt"
    dcp_to_torch_save(out / "checkpoints" / f"step-{STEPS:06d}" / "trainer", path)
    state: dict[str, Any] = torch.load(path, weights_only=False)
    return state


def assert_same_state(a: Any, b: Any) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same_state(a[k], b[k])
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b)  # bit for bit
    else:
        assert a == b


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory, tiny_checkpoint: Path) -> Path:
    """The LoRA run left alone."""
    out = tmp_path_factory.mktemp("clean-lora")
    cfg = config(out, tiny_checkpoint)
    summary = asyncio.run(run(cfg, prepare(cfg), quiet=True))
    assert summary.steps == STEPS
    return out


def test_every_sync_moves_the_adapter_alone(clean: Path, tiny_checkpoint: Path) -> None:
    adapter = adapter_state(add_adapters(load_policy(str(tiny_checkpoint)), LoraConfig(rank=4)))
    adapter_bytes = sum(t.numel() * t.element_size() for t in adapter.values())
    whole = load_policy(str(tiny_checkpoint)).state_dict()
    assert [r["weight_sync_bytes"] for r in rows(clean)] == [adapter_bytes] * STEPS
    assert adapter_bytes < sum(t.numel() * t.element_size() for t in whole.values()) / 4
    weights = final_state(clean)["model"]
    assert weights
    assert all(".lora_A." in n or ".lora_B." in n for n in weights)
    # On-policy in sync mode: sampled by the weights that trained on them.
    assert all(r["staleness_mean"] == 0 for r in rows(clean))


def kill_at_step(opts: dict[str, str], out: Path, step: int) -> None:
    """Runs `async-grpo` with `opts` as its own process group and SIGKILLs all of it once
    `step` steps are recorded."""
    args = [f"--{k}={v}" for k, v in opts.items()]
    env = {**os.environ, "HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY": "1s"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "async_grpo.cli", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    metrics = out / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 240
        while not metrics.exists() or len(metrics.read_text().splitlines()) < step:
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, f"no step {step} within 240 s"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_sigkilled_lora_run_resumes_exactly(
    clean: Path, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    kill_at_step(options(tmp_path, tiny_checkpoint), tmp_path, KILL_AT)
    assert len(rows(tmp_path)) == KILL_AT
    assert main(["--resume", "--out_dir", str(tmp_path)]) == 0  # resumes step-000004
    assert trained(tmp_path) == trained(clean)
    assert rows(tmp_path)[-1]["resumes"] == 1
    assert_same_state(final_state(tmp_path), final_state(clean))


def test_a_killed_lora_trainer_is_restored_exactly(
    clean: Path, tiny_checkpoint: Path, tmp_path: Path
) -> None:
    cfg = config(tmp_path, tiny_checkpoint)
    started: list[Components] = []
    lines: list[str] = []

    def on_step(row: StepRow, result: TrainResult) -> None:
        del result
        if row.version == KILL_AT and row.trainer_restores == 0:
            os.kill(started[0].trainer.pid_list[0], signal.SIGKILL)

    spawn = keeping(started)
    asyncio.run(run(cfg, prepare(cfg), quiet=True, on_step=on_step, log=lines.append, spawn=spawn))
    assert len([x for x in lines if x.startswith("[trainer died:")]) == 1, lines
    assert (rows(tmp_path)[-1]["trainer_restores"], rows(tmp_path)[-1]["steps_redone"]) == (1, 1)
    assert trained(tmp_path) == trained(clean)
    assert_same_state(final_state(tmp_path), final_state(clean))
