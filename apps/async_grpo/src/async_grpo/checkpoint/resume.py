"""Continuing a run from a checkpoint: finding it, checking it whole, and reading back the
consistent point it holds (a `Cut`), all before any process is spawned.

`uv run async-grpo --resume` continues the newest checkpoint of `--out_dir`; `--resume PATH`
a given one (a checkpoint directory, or a run directory holding checkpoints). The run's
config is the checkpoint's, with the command line's options applied on top (or, with
`--preset`, the preset's); only the fields in `MAY_CHANGE` may then differ from the
checkpoint's. A trainer that dies mid-run is restored from the same kind of cut
(`controller/recovery.py`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from async_grpo.checkpoint import disk
from async_grpo.checkpoint.codec import CheckpointError
from async_grpo.checkpoint.disk import CONFIG_FILE
from async_grpo.config.args import build_config, config_keys, parse, take_flag
from async_grpo.config.schema import ConfigError, RunConfig

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
    "metrics.",
    "placement.",
    "trainer.procs",
    "generator.replicas",
    "generator.engine",
    "generator.kv_cache_gib",
    "generator.tensor_parallel",
    "generator.kv_block_tokens",
    "generator.call_timeout_s",
    "trainer.step_timeout_s",
    "trainer.call_timeout_s",
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


def find_checkpoint(target: str, out_dir: Path) -> Path:
    """The checkpoint `--resume TARGET` names ("": the newest of `out_dir`)."""
    where = Path(target) if target else out_dir
    if where.is_file():
        raise ConfigError(f"--resume: {where} is a file; give a checkpoint or a run directory")
    if (where / disk.MANIFEST).exists() or disk.version_of(where) is not None:
        return where
    for root in (where, where.parent):  # a run directory, or its checkpoints directory
        found = disk.complete(root)
        if found:
            return found[-1]
    if target and not where.exists():
        raise ConfigError(f"--resume: {where} does not exist")
    raise ConfigError(
        f"--resume: no checkpoint in {disk.checkpoints_dir(where)} (a run writes one "
        "every --checkpoint.every steps, at its end and on Ctrl-C); start without --resume"
    )


def saved_config(path: Path) -> RunConfig:
    """The config a checkpoint was written with."""
    return read_config(path / CONFIG_FILE)


def read_config(file: Path) -> RunConfig:
    """A run's config as a checkpoint holds it: the JSON of `dataclasses.asdict(RunConfig)`."""
    try:
        raw = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{file} is not a readable run config ({e})") from None
    return config_from(raw, str(file))


def config_from(raw: Any, where: str) -> RunConfig:
    """A run's config from its parsed JSON (`dataclasses.asdict(RunConfig)`); `where` names
    it in the error."""
    try:
        if not isinstance(raw, dict):
            raise ValueError(f"expected an object, got {type(raw).__name__}")
        return parse([f"--{k}={v}" for k, v in _flat(raw).items()], RunConfig())
    except ValueError as e:  # ConfigError is a ValueError
        raise CheckpointError(f"{where} is not a readable run config ({e})") from None


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
    version = disk.version_of(path) or 0
    newer = [p.name for p in disk.complete(out_dir) if (disk.version_of(p) or 0) > version]
    if newer:
        raise ConfigError(
            f"--resume: {out_dir} holds checkpoints newer than {path.name} ({', '.join(newer)}) "
            "that this run would overwrite; resume the newest, or give another --out_dir"
        )


def check_fresh_start(out_dir: Path) -> None:
    """A new run (no `--resume`) replaces what `out_dir` holds, the checkpoints of a finished
    run included; the checkpoints of a run that stopped before its last step (interrupted,
    killed, or out of time) are refused instead: `--resume` is how to continue it."""
    found = disk.complete(out_dir)
    if not found:
        return
    newest = found[-1]
    try:
        steps: int | None = saved_config(newest).steps
    except CheckpointError:
        steps = None
    if steps is not None and (disk.version_of(newest) or 0) >= steps:
        return
    of = f" of {steps} steps" if steps is not None else ""
    raise ConfigError(
        f"{out_dir} holds the checkpoints of a run that did not finish (the newest is "
        f"{newest.name}{of}): `--resume` continues it; to start a new run there, delete "
        f"{disk.checkpoints_dir(out_dir)} first, or give another --out_dir"
    )


def start_fresh(out_dir: Path) -> list[Path]:
    """Clears `out_dir` for a new run: refuses (`check_fresh_start`) when it holds a run
    that did not finish, else deletes the finished run's checkpoints; returns those
    deleted. Pruning and `--resume` then only ever see the new run's checkpoints."""
    check_fresh_start(out_dir)
    return disk.prune(out_dir, keep=0)


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
    newest = disk.complete(Path(out_dir))
    if not newest:
        return "no checkpoint was written yet"
    return (
        f"the newest checkpoint is {newest[-1]}: `uv run async-grpo --resume --out_dir "
        f"{out_dir}` continues from it"
    )


def resume_config(target: str, argv: list[str], help_text: str = "") -> tuple[RunConfig, Path]:
    """The config of a resumed run and its checkpoint: the checkpoint's config with `argv`
    applied on top (with `--preset`: the preset's, as without `--resume`), checked against
    the checkpoint's (`resume.MAY_CHANGE`)."""
    given = build_config(argv, help_text)
    path = find_checkpoint(target, Path(given.out_dir))
    saved = saved_config(path)
    with_preset = any(a == "--preset" or a.startswith("--preset=") for a in argv)
    cfg = given if with_preset else parse(argv, saved)
    check_compatible(path, saved, cfg)
    check_newest(path, Path(cfg.out_dir))
    return cfg, path
