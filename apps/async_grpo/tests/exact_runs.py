"""Short sync runs compared bit for bit: the options both the full and the LoRA
fault-tolerance tests start from, what a run trained (per-step metrics and prompts), its
last checkpoint's trainer state, a run SIGKILLed whole at a given step, and a resumed run
whose trainer is SIGKILLed at a given step.

6 sync steps with a checkpoint every 2, so a kill at step 5 costs one step."""

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
from async_grpo.actors._test_hang import HANG_ENV
from async_grpo.actors.trainer import TrainResult
from async_grpo.checkpoint.resume import resume_config
from async_grpo.cli.training import prepare_start
from async_grpo.config.args import apply_overrides
from async_grpo.config.presets import tiny
from async_grpo.controller.job import StepCallback
from async_grpo.launch.prepare import prepare
from async_grpo.launch.spawn import Components
from async_grpo.observability.console import Summary
from async_grpo.observability.metrics import StepRow
from async_grpo.train import run
from jobs import keeping, rows
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

STEPS, KILL_AT = 6, 5  # checkpoints at 2, 4, 6: the kill costs step 5
COMPARED = ("version", "loss", "reward_window", "exact_window", "grad_norm", "lr", "entropy")


def sync_options(out: Path, model: Path) -> dict[str, str]:
    """A small sync run of `STEPS` steps into `out`, as `--key value` options."""
    return {
        "mode": "sync",
        "steps": str(STEPS),
        "checkpoint.every": "2",
        "eval_every": "0",
        "model.path": str(model),
        "sampling.group_size": "8",
        "trainer.batch_size": "32",
        "generator.prompts_per_call": "2",
        "buffer.capacity": "64",
        "window": "32",
        "out_dir": str(out),
    }


def run_left_alone(tmp: pytest.TempPathFactory, name: str, opts: dict[str, str]) -> Path:
    """Runs `opts` (its `out_dir` replaced by a new directory `name`) to its end, untouched,
    and returns that directory: what the killed runs are compared with."""
    out = tmp.mktemp(name)
    cfg = apply_overrides(tiny(), {**opts, "out_dir": str(out)})
    summary = asyncio.run(run(cfg, prepare(cfg), quiet=True))
    assert summary.steps == STEPS
    return out


def trained(out: Path) -> list[Any]:
    """Per step: the compared metrics and the prompts it trained on."""
    prompts = [json.loads(x) for x in (out / "trained_prompts.jsonl").read_text().splitlines()]
    return [([r[k] for k in COMPARED], p) for r, p in zip(rows(out), prompts, strict=True)]


def final_state(out: Path) -> dict[str, Any]:
    """The last checkpoint's trainer state (what trains, its AdamW moments, the version)."""
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


def kill_at_step(opts: dict[str, str], out: Path, step: int) -> None:
    """Runs `async-grpo` with `opts` as its own process group and SIGKILLs all of it (the
    controller and every process it started) once `step` steps are recorded. The trainer's
    next step never ends (`HANG_ENV`), so no later step is recorded before the kill: on a
    fast machine two steps came within one 50 ms poll, and the run was killed at step 6."""
    args = [f"--{k}={v}" for k, v in opts.items()]
    held = out.parent / f"{out.name}-held-trainer"  # the hook's marker, outside the run
    env = {
        **os.environ,
        "HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY": "1s",
        HANG_ENV: f"trainer.train_step:{step + 1}:{held}",
    }
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


def kill_trainer_at(
    step: int, started: list[Components], sig: signal.Signals = signal.SIGKILL
) -> StepCallback:
    """An `on_step` that sends `sig` to the trainer's process once, when `step` is recorded
    (the components of the run are the first of `started`)."""

    def on_step(row: StepRow, result: TrainResult) -> None:
        del result
        if row.version == step and row.trainer_restores == 0:
            os.kill(started[0].trainer.pid_list[0], sig)

    return on_step


def assert_trainer_restored(lines: list[str], out: Path, killed_at: int) -> None:
    """The run in `out` (its log `lines`) lost its trainer once, at step `killed_at`, and
    restored it from the newest complete checkpoint: step 4's, or step 2's when step 4's
    background write had not finished when the trainer died (a loaded machine); the steps
    since that checkpoint were trained again."""
    died = [x for x in lines if x.startswith("[trainer died:")]
    assert len(died) == 1, lines
    source = int(died[0].split("restoring it from step-")[1][:6])
    assert source in (2, 4), died
    back = [x for x in lines if x.startswith(f"[trainer is back at version {source} after")]
    assert len(back) == 1, lines
    redone = killed_at - source
    assert ("step 5 is" if redone == 1 else "steps 3-5 are") + " trained again" in back[0]
    last = rows(out)[-1]
    assert (last["trainer_restores"], last["steps_redone"]) == (1, redone)
    assert last["restore_s"] > 0


def resume_killing_the_trainer(
    out: Path, step: int, log: list[str], sig: signal.Signals = signal.SIGKILL
) -> Summary:
    """Resumes the newest checkpoint in `out` as `async-grpo --resume --out_dir OUT` does (its
    config read and checked by `resume_config`, the run prepared by `prepare_start`) and
    kills the resumed run's trainer with `sig` when `step` is recorded; `log` gets the run's
    lines."""
    cfg, path = resume_config("", ["--out_dir", str(out)])
    start = prepare_start(cfg, path)
    started: list[Components] = []
    job = run(
        cfg,
        start.prep,
        resume=start.resume,
        quiet=True,
        on_step=kill_trainer_at(step, started, sig),
        log=log.append,
        spawn=keeping(started),
    )
    return asyncio.run(job)
