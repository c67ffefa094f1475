"""The cut: what the controller writes into a checkpoint directory and reads back from it.

A checkpoint (`checkpoint/disk.py`: the directory, its manifest, written atomically) holds
the trainer's distributed checkpoint (`trainer/`, `checkpoint/trainer_state.py`) and the
controller's files, written by `write_files` and read back whole by `read_cut`:

    config.json            the run's config
    controller.json        `ControllerState`: the prompt ledger, the metrics so far, the task
                           draws, an evaluation still running
    buffer.pt              the replay buffer's `state_dict` (`torch.save`)
    metrics.jsonl          the metrics rows up to the cut's version
    trained_prompts.jsonl  the prompts each of those steps trained on
"""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import torch
from replay_buffer import ReplayBuffer, ReplayBufferConfig

from async_grpo.checkpoint.codec import CheckpointError, decode
from async_grpo.checkpoint.disk import (
    BUFFER_FILE,
    CONFIG_FILE,
    CONTROLLER_FILE,
    TRAINER_DIR,
    verify,
)
from async_grpo.config.schema import RunConfig
from async_grpo.controller.ledger import LedgerState
from async_grpo.observability.metrics import MetricsState
from async_grpo.observability.sink import METRICS_FILE, PROMPTS_FILE
from async_grpo.tasks.environments import TaskSourceState


@dataclasses.dataclass(frozen=True)
class ControllerState:
    """The controller at a checkpoint's cut: the trainer `version` it was taken at, the
    prompt ledger, the metrics, the task source's state (multi-turn runs; None otherwise),
    and the step of an evaluation that was still running (None if none): a resumed run
    runs it again."""

    version: int
    ledger: LedgerState
    metrics: MetricsState
    tasks: TaskSourceState | None
    pending_eval: int | None


def encode(state: ControllerState) -> str:
    return json.dumps(dataclasses.asdict(state))


def parse(text: str) -> ControllerState:
    """`encode`'s output back; `CheckpointError` names what does not fit."""
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise CheckpointError(f"controller state is not JSON ({e})") from None
    state: ControllerState = decode(ControllerState, raw, "controller")
    return state


@dataclasses.dataclass(frozen=True)
class Cut:
    """A consistent point of a run to continue from: `checkpoint`, the directory it was read
    from (None: the run's start, nothing on disk); the controller's state; the buffer's
    `state_dict` (None: empty); the metrics rows and trained-prompt rows up to its version
    (the text of the two JSONL files)."""

    checkpoint: Path | None
    controller: ControllerState
    buffer: dict[str, Any] | None
    metrics_rows: str
    prompt_rows: str

    @property
    def version(self) -> int:
        return self.controller.version

    @property
    def trainer(self) -> Path | None:
        """The trainer's distributed checkpoint, or None at the run's start."""
        return None if self.checkpoint is None else self.checkpoint / TRAINER_DIR


def read_cut(path: Path, buffer_config: ReplayBufferConfig) -> Cut:
    """Checkpoint `path` read back and checked whole (every file's size and hash, the
    controller's state, the buffer's state against the run's buffer config)."""
    manifest = verify(path)
    controller = parse((path / CONTROLLER_FILE).read_text())
    if controller.version != manifest.version:
        raise CheckpointError(
            f"{path}: its controller state is of version {controller.version}, its manifest "
            f"says {manifest.version}"
        )
    try:
        state = torch.load(io.BytesIO((path / BUFFER_FILE).read_bytes()), weights_only=True)
        ReplayBuffer(buffer_config).load_state_dict(state)  # checks it, here
    except (ValueError, RuntimeError, OSError) as e:
        raise CheckpointError(f"{path / BUFFER_FILE}: {e}") from None
    return Cut(
        checkpoint=path,
        controller=controller,
        buffer=state,
        metrics_rows=(path / METRICS_FILE).read_text(),
        prompt_rows=(path / PROMPTS_FILE).read_text(),
    )


HOLDS = (
    f"{TRAINER_DIR}/: the trainer's weights, AdamW state and version "
    "(torch.distributed.checkpoint; loads into any number of trainer processes)",
    f"{BUFFER_FILE}: the replay buffer's state_dict (held groups, counters, RNG)",
    f"{CONTROLLER_FILE}: the prompt ledger (next prompt, prompts to draw again, held "
    "groups), the metrics so far, the task draws' RNG",
    f"{CONFIG_FILE}: the run's config",
    f"{METRICS_FILE}, {PROMPTS_FILE}: the rows of every step up to this version",
)


def write_files(
    partial: Path,
    cfg: RunConfig,
    state: ControllerState,
    buffer: dict[str, Any],
    *,
    metrics_rows: str,
    prompt_rows: str,
) -> None:
    """Writes the controller's files of a checkpoint into `partial` (blocking)."""
    (partial / CONFIG_FILE).write_text(json.dumps(dataclasses.asdict(cfg), default=str))
    (partial / CONTROLLER_FILE).write_text(encode(state))
    torch.save(buffer, partial / BUFFER_FILE)
    (partial / METRICS_FILE).write_text(metrics_rows)
    (partial / PROMPTS_FILE).write_text(prompt_rows)
