"""Continuing a run from a checkpoint: finding it, checking it whole, and reading back the
consistent point it holds (a `Cut`), all before any process is spawned.

`uv run async-grpo --resume` continues the newest checkpoint of `--out_dir`; `--resume PATH`
a given one (a checkpoint directory, or a run directory holding checkpoints). The run's
config is the checkpoint's, with the command line's options applied on top (or, with
`--preset`, the preset's); only the fields in `MAY_CHANGE` may then differ from the
checkpoint's. A trainer that dies mid-run is restored from the same kind of cut
(`recovery.py`).
"""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import torch
from replay_buffer import ReplayBuffer, ReplayBufferConfig

from async_grpo import run_checkpoint, run_state
from async_grpo.arguments import config_keys, parse, take_flag
from async_grpo.config import ConfigError, RunConfig
from async_grpo.metrics_sink import METRICS_FILE, PROMPTS_FILE
from async_grpo.run_checkpoint import CheckpointError
from async_grpo.run_state import ControllerState

MAY_CHANGE: tuple[str, ...] = (
    "steps",
    "max_minutes",
    "stop_at_reward",
    "log_every",
    "eval_every",
    "eval_prompts",
    "out_dir",
    "trace",
    "rollout_loops",
    "max_restarts",
    "checkpoint.",
    "placement.",
    "trainer.procs",
    "generator.replicas",
    "generator.engine",
    "generator.kv_cache_gib",
    "generator.tensor_parallel",
    "generator.kv_block_tokens",
    "generator.call_timeout_s",
    "reward.replicas",
    "reward.call_timeout_s",
    "env.replicas",
    "env.step_timeout_s",
    "env.call_timeout_s",
)
"""Config keys (a trailing "." names a section) a resumed run may set differently from its
checkpoint: how long it runs, how it reports, how many processes it uses and on which
hosts, how failures are handled. Everything else decides what is trained and must match.
`steps` also sets the length of a cosine learning-rate schedule, so changing it reshapes
the remaining schedule."""

CONFIG_FILE = "config.json"
CONTROLLER_FILE = "controller.json"
BUFFER_FILE = "buffer.pt"
TRAINER_DIR = "trainer"


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


def find_checkpoint(target: str, out_dir: Path) -> Path:
    """The checkpoint `--resume TARGET` names ("": the newest of `out_dir`)."""
    where = Path(target) if target else out_dir
    if where.is_file():
        raise ConfigError(f"--resume: {where} is a file; give a checkpoint or a run directory")
    if (where / run_checkpoint.MANIFEST).exists() or run_checkpoint.version_of(where) is not None:
        return where
    for root in (where, where.parent):  # a run directory, or its checkpoints directory
        found = run_checkpoint.complete(root)
        if found:
            return found[-1]
    if target and not where.exists():
        raise ConfigError(f"--resume: {where} does not exist")
    raise ConfigError(
        f"--resume: no checkpoint in {run_checkpoint.checkpoints_dir(where)} (a run writes one "
        "every --checkpoint.every steps, at its end and on Ctrl-C); start without --resume"
    )


def saved_config(path: Path) -> RunConfig:
    """The config a checkpoint was written with."""
    try:
        raw = json.loads((path / CONFIG_FILE).read_text())
        return parse([f"--{k}={v}" for k, v in _flat(raw).items()], RunConfig())
    except (OSError, ValueError) as e:  # ConfigError is a ValueError
        raise CheckpointError(f"{path / CONFIG_FILE} is not a readable run config ({e})") from None


def config_differences(saved: RunConfig, new: RunConfig) -> list[str]:
    """`key (checkpoint X, here Y)` for every field outside `MAY_CHANGE` that differs."""
    old, now = _flat(dataclasses.asdict(saved)), _flat(dataclasses.asdict(new))
    return [
        f"{key} (checkpoint {old.get(key)!r}, here {now.get(key)!r})"
        for key in config_keys(new)
        if old.get(key) != now.get(key) and not _may_change(key)
    ]


def check_compatible(path: Path, saved: RunConfig, cfg: RunConfig) -> None:
    """Raises `ConfigError` listing the fields that may not differ but do."""
    differ = config_differences(saved, cfg)
    if differ:
        allowed = ", ".join(k.rstrip(".") + ("*" if k.endswith(".") else "") for k in MAY_CHANGE)
        raise ConfigError(
            f"--resume: {path} was written by a run with another config; these fields "
            f"differ: {'; '.join(differ)}. Only these may change on resume: {allowed}"
        )


def check_newest(path: Path, out_dir: Path) -> None:
    """Resuming an older checkpoint into a run directory that holds newer ones would
    overwrite them as the run reaches their versions: refused."""
    version = run_checkpoint.version_of(path) or 0
    newer = [
        p.name
        for p in run_checkpoint.complete(out_dir)
        if (run_checkpoint.version_of(p) or 0) > version
    ]
    if newer:
        raise ConfigError(
            f"--resume: {out_dir} holds checkpoints newer than {path.name} ({', '.join(newer)}) "
            "that this run would overwrite; resume the newest, or give another --out_dir"
        )


def check_fresh_start(out_dir: Path) -> None:
    """A new run (no `--resume`) replaces what `out_dir` holds, the checkpoints of a finished
    run included; the checkpoints of a run that stopped before its last step (interrupted,
    killed, or out of time) are refused instead: `--resume` is how to continue it."""
    found = run_checkpoint.complete(out_dir)
    if not found:
        return
    newest = found[-1]
    try:
        steps: int | None = saved_config(newest).steps
    except CheckpointError:
        steps = None
    if steps is not None and (run_checkpoint.version_of(newest) or 0) >= steps:
        return
    of = f" of {steps} steps" if steps is not None else ""
    raise ConfigError(
        f"{out_dir} holds the checkpoints of a run that did not finish (the newest is "
        f"{newest.name}{of}): `--resume` continues it; to start a new run there, delete "
        f"{run_checkpoint.checkpoints_dir(out_dir)} first, or give another --out_dir"
    )


def start_fresh(out_dir: Path) -> list[Path]:
    """Clears `out_dir` for a new run: refuses (`check_fresh_start`) when it holds a run
    that did not finish, else deletes the finished run's checkpoints; returns those
    deleted. Pruning and `--resume` then only ever see the new run's checkpoints."""
    check_fresh_start(out_dir)
    return run_checkpoint.prune(out_dir, keep=0)


def read_cut(path: Path, buffer_config: ReplayBufferConfig) -> Cut:
    """Checkpoint `path` read back and checked whole (every file's size and hash, the
    controller's state, the buffer's state against the run's buffer config)."""
    manifest = run_checkpoint.verify(path)
    controller = run_state.parse((path / CONTROLLER_FILE).read_text())
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


def _may_change(key: str) -> bool:
    return any(key == k or (k.endswith(".") and key.startswith(k)) for k in MAY_CHANGE)


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config values as dotted keys -> their command-line spelling."""
    out: dict[str, str] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def split_resume(argv: list[str]) -> tuple[str | None, list[str]]:
    """Takes `--resume [PATH]` out of `argv`: (None without it, "" for the newest checkpoint
    of the out_dir, or PATH; the rest)."""
    return take_flag(argv, "--resume", bare="")


def resume_hint(out_dir: str) -> str:
    """How to continue a run that ended early, or that nothing can continue (no
    checkpoint yet)."""
    newest = run_checkpoint.complete(Path(out_dir))
    if not newest:
        return "no checkpoint was written yet"
    return (
        f"the newest checkpoint is {newest[-1]}: `uv run async-grpo --resume --out_dir "
        f"{out_dir}` continues from it"
    )
