"""`async-grpo eval`'s command line: what to evaluate (`find_target`) and how
(`parse_args`), read and checked whole before anything is loaded (`cli/evaluate.py`). The
parts that look at nothing on disk (`split_args`, `read_config`, `eval_options`) also check
the commands the docs quote (`tests/test_doc_commands.py`)."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from async_grpo.checkpoint.disk import read_manifest
from async_grpo.checkpoint.export import find_checkpoint, is_run_output, read_export_info
from async_grpo.checkpoint.resume import saved_config
from async_grpo.config.args import config_keys, parse, take_flag
from async_grpo.config.presets import DEFAULT_PRESET, PRESETS
from async_grpo.config.schema import ConfigError, RunConfig
from async_grpo.model.locate import ModelNotFound, locate_model
from async_grpo.tasks.rewards import parse_weights

EVAL_KEYS = (
    "data.",
    "reward.fns",
    "sampling.",
    "eval_prompts",
    "seed",
    "model.chat_template",
    "model.dtype",
    "device",
)
"""The config keys `eval` reads (a trailing "." names a section); any other is refused."""


@dataclasses.dataclass(frozen=True)
class Target:
    """What is evaluated: `model_dir`, a model directory (`checkpoint`: the checkpoint's,
    whose policy is its run's base model with its weights; `adapter`: a LoRA adapter's,
    merged onto the base model it names); `version` the
    weight version (0 for a model from elsewhere), which seeds the samples as the run's
    evaluation after that step; `config` the run's config, None for a model from
    elsewhere."""

    model_dir: str
    checkpoint: Path | None
    version: int
    config: RunConfig | None
    adapter: bool = False


@dataclasses.dataclass(frozen=True)
class EvalOptions:
    """The command line: the target, the config it is read with, and `eval`'s own options."""

    target: Target
    cfg: RunConfig
    samples: int
    greedy: bool
    correct_at: float
    json_path: Path | None
    batch_prompts: int
    whole_dataset: bool


def find_target(raw: str) -> Target:
    """A run directory or checkpoint, an export or another model directory, or a cached hub
    id."""
    path = Path(raw)
    if path.exists() and is_run_output(path):
        checkpoint = find_checkpoint(path)
        version = read_manifest(checkpoint).version
        return Target(str(checkpoint), checkpoint, version, saved_config(checkpoint))
    adapter = path.is_dir() and (path / "adapter_config.json").is_file()
    if path.is_dir() and not adapter and not (path / "config.json").is_file():
        raise ConfigError(
            f"{raw} is not a model directory (no config.json), an adapter (no "
            "adapter_config.json), a run or a checkpoint"
        )
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{raw} is a file, not a model directory, a run or a checkpoint")
    if adapter:
        info = read_export_info(path)
        version, config = (info.version, info.config) if info else (0, None)
        return Target(str(path), None, version, config, adapter=True)
    try:
        model_dir = locate_model(raw)
    except ModelNotFound:
        raise ConfigError(
            f"{raw} does not exist, and is not a hub id in the local Hugging Face cache"
        ) from None
    info = read_export_info(Path(model_dir))
    if info is None:
        return Target(model_dir, None, 0, None)
    return Target(model_dir, None, info.version, info.config)


@dataclasses.dataclass(frozen=True)
class Flags:
    """`eval`'s own options, as given (None: not given)."""

    samples: int | None
    greedy: bool
    correct_at: float | None
    json_path: Path | None
    batch_prompts: int | None
    preset: str | None


def _flag(
    argv: list[str], flag: str, convert: Callable[[str], Any], rule: str, bare: str | None = None
) -> Any:
    """Takes `flag VALUE` out of `argv` (in place), converted; None without it."""
    value, argv[:] = take_flag(argv, flag, bare=bare)
    if value is None:
        return None
    try:
        return convert(value)
    except ValueError:
        raise ConfigError(f"{flag}: expected {rule}, got {value!r}") from None


def split_args(argv: Sequence[str]) -> tuple[str, Flags, list[str]]:
    """The command line taken apart without looking at the disk: the model, `eval`'s own
    options, and the config options (`--section.field value`)."""
    if not argv or argv[0].startswith("-"):
        raise ConfigError("give the model first: async-grpo eval MODEL_DIR_OR_CHECKPOINT [...]")
    rest = list(argv[1:])
    flags = Flags(
        samples=_flag(rest, "--samples", int, "an integer >= 1"),
        greedy=bool(_flag(rest, "--greedy", _true_false, "true or false", bare="true")),
        correct_at=_flag(rest, "--correct_at", float, "a number"),
        json_path=_flag(rest, "--json", Path, "a file path"),
        batch_prompts=_flag(rest, "--batch_prompts", int, "an integer >= 1"),
        preset=_flag(rest, "--preset", str, "a preset name"),
    )
    if flags.preset is not None and flags.preset not in PRESETS:
        raise ConfigError(f"--preset: unknown preset {flags.preset!r}; known: {sorted(PRESETS)}")
    return argv[0], flags, rest


def read_config(rest: list[str], base: RunConfig) -> RunConfig:
    """`base` (the run's config, or a preset's) with the config options `rest` applied;
    refuses a key `eval` does not read, and a run on environments without a task given."""
    cfg = parse(rest, base)
    for key in config_keys(cfg):
        if _get(cfg, key) != _get(base, key) and not key.startswith(EVAL_KEYS):
            reads = ", ".join(k + "*" if k.endswith(".") else k for k in EVAL_KEYS)
            raise ConfigError(f"{key}: eval does not use it; it reads {reads}")
    if cfg.env.tasks and not any(a.startswith("--data.") for a in rest):
        raise ConfigError(
            f"the run trained on environments (env.tasks {cfg.env.tasks!r}); eval scores "
            "prompts: give --data.task or --data.path"
        )
    return cfg


def eval_options(target: Target, flags: Flags, cfg: RunConfig, rest: list[str]) -> EvalOptions:
    """The options of one evaluation, their ranges checked (`check`)."""
    samples = flags.samples
    if samples is None:
        samples = 1 if flags.greedy else cfg.sampling.group_size
    options = EvalOptions(
        target=target,
        cfg=cfg,
        samples=samples,
        greedy=flags.greedy,
        correct_at=1.0 if flags.correct_at is None else flags.correct_at,
        json_path=flags.json_path,
        batch_prompts=64 if flags.batch_prompts is None else flags.batch_prompts,
        whole_dataset=any(a.startswith(("--data.path", "--data.hf_name")) for a in rest)
        and not any(a.startswith("--eval_prompts") for a in rest),
    )
    check(options)
    return options


def parse_args(argv: Sequence[str]) -> EvalOptions:
    """The command line read and checked whole, the model found and `--json`'s directory
    checked (nothing loaded yet); `ConfigError` names the first problem."""
    raw, flags, rest = split_args(argv)
    target = find_target(raw)
    if target.config is not None and flags.preset is not None:
        raise ConfigError("--preset: the run's config gives the defaults of a run's model")
    base = target.config or PRESETS[flags.preset or DEFAULT_PRESET]()
    options = eval_options(target, flags, read_config(rest, base), rest)
    if options.json_path is not None:
        where = options.json_path
        if where.is_dir():
            raise ConfigError(f"--json: {where} is a directory")
        if not where.parent.is_dir() or not os.access(where.parent, os.W_OK | os.X_OK):
            raise ConfigError(f"--json: {where.parent} is not a writable directory")
    return options


def _true_false(raw: str) -> bool:
    if raw not in ("true", "false"):
        raise ValueError(raw)
    return raw == "true"


def _get(cfg: RunConfig, key: str) -> Any:
    return functools.reduce(getattr, key.split("."), cfg)


def check(o: EvalOptions) -> None:
    """The ranges `eval` needs (the run's own checks cover what training needs); looks at
    nothing on disk."""
    d, s = o.cfg.data, o.cfg.sampling
    ranges = [
        ("--samples", o.samples >= 1, ">= 1"),
        ("--batch_prompts", o.batch_prompts >= 1, ">= 1"),
        ("--correct_at", math.isfinite(o.correct_at), "a finite number"),
        ("eval_prompts", o.cfg.eval_prompts >= 1, ">= 1"),
        ("data.min_n", 1 <= d.min_n <= d.max_n, ">= 1 and <= data.max_n"),
        ("sampling.max_new_tokens", s.max_new_tokens >= 1, ">= 1"),
        ("sampling.temperature", s.temperature > 0, "> 0"),
        ("sampling.top_p", 0 < s.top_p <= 1, "in (0, 1]"),
    ]
    for key, ok, rule in ranges:
        if not ok:
            raise ConfigError(f"{key} must be {rule}")
    if o.greedy and o.samples > 1:
        raise ConfigError("--greedy gives one answer per prompt; --samples K > 1 needs sampling")
    if d.path and d.hf_name:
        raise ConfigError("data.path and data.hf_name are both set; give one dataset")
    if o.cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device cuda: torch sees no GPU here; give --device cpu or auto")
    try:
        parse_weights(o.cfg.reward.fns)
    except ValueError as e:
        raise ConfigError(f"reward.fns: {e}") from None
