"""Typed configuration: one dataclass per component, one `RunConfig` holding them all.

Presets (see `presets.py`) build a `RunConfig`; command-line overrides such as
`--trainer.lr 3e-4` are applied with `apply_overrides`, where an unknown key or a value of the
wrong type is an error naming it; `validate` checks ranges. Both run in the controller before
any process is spawned.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import types
import typing
from typing import Any, Literal


class ConfigError(ValueError):
    """A configuration value is unknown, ill-typed or out of range."""


@dataclasses.dataclass
class ModelConfig:
    """The policy. `path`: a local checkpoint directory or a hub id; empty builds a random
    checkpoint of architecture `arch` (see `presets.ARCHS`) into the run directory.
    `random_weights=True` also ignores `path` and builds `arch` from its config values."""

    path: str = ""
    arch: str = "tiny"
    random_weights: bool = False
    chat_template: bool = False
    dtype: Literal["float32", "bfloat16"] = "float32"
    init_seed: int = 0


@dataclasses.dataclass
class DataConfig:
    """Prompts: a generated `task`, or a local JSONL `path`, or a Hugging Face `hf_name`."""

    task: Literal["count", "arithmetic"] = "count"
    min_n: int = 1
    max_n: int = 6
    path: str = ""
    hf_name: str = ""
    hf_split: str = "train"
    prompt_key: str = "prompt"
    target_key: str = "target"


@dataclasses.dataclass
class SamplingConfig:
    """How the generator samples: `group_size` responses per prompt, at most
    `max_new_tokens` each, from softmax(logits / temperature) cut to the top-p nucleus."""

    group_size: int = 8
    max_new_tokens: int = 8
    temperature: float = 1.0
    top_p: float = 1.0


@dataclasses.dataclass
class GeneratorConfig:
    """The generator service: `replicas` processes, `prompts_per_call` prompts per request."""

    replicas: int = 2
    prompts_per_call: int = 4


@dataclasses.dataclass
class RewardConfig:
    """Reward functions by name with weights, e.g. "count" or "numeric:0.9,format:0.1"."""

    fns: str = "count"
    replicas: int = 1


@dataclasses.dataclass
class TrainerConfig:
    """GRPO trainer: AdamW on the token-level loss of `grpo.grpo_loss`.

    `batch_size` counts episodes (a multiple of the group size); `kl_coef > 0` spawns the
    reference model; `entropy_coef > 0` adds an entropy bonus (`grpo.LossConfig`);
    `adam_beta2` is AdamW's second-moment decay. `lr_schedule="cosine"`: linear warm-up
    over `warmup_steps`, then a cosine decay to `lr * min_lr_ratio` at the run's last step
    (`training.learning_rate`).
    `procs > 1` shards the trainer FSDP-style over that many processes (every parameter a
    `Shard(0)` DTensor; gloo on CPU, nccl on GPU) and sends weights to the generators through
    `dtensor-reshard`; `procs == 1` is one process sending them through `rdma-tensor`."""

    lr: float = 1e-3
    adam_beta2: float = 0.999
    lr_schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    batch_size: int = 64
    clip_eps: float = 0.2
    importance: Literal["clip", "truncate"] = "clip"
    truncate_cap: float = 2.0
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    scale_by_std: bool = True
    procs: int = 1


@dataclasses.dataclass
class BufferConfig:
    """Replay buffer: episodes older than `max_policy_age` versions are never trained on;
    `capacity` bounds how many episodes wait (producers are held back beyond it)."""

    max_policy_age: int = 1
    capacity: int = 512


@dataclasses.dataclass
class RunConfig:
    """A whole run. `mode="sync"` is the async loop with `max_policy_age` forced to 0.

    `window`: episodes in the running training reward. `eval_every`: train steps between
    evaluations of the policy on a fixed prompt set (`tasks.eval_set`, at most
    `eval_prompts` prompts; every N of the count task), plus one at the end; 0: none."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    sampling: SamplingConfig = dataclasses.field(default_factory=SamplingConfig)
    generator: GeneratorConfig = dataclasses.field(default_factory=GeneratorConfig)
    reward: RewardConfig = dataclasses.field(default_factory=RewardConfig)
    trainer: TrainerConfig = dataclasses.field(default_factory=TrainerConfig)
    buffer: BufferConfig = dataclasses.field(default_factory=BufferConfig)
    mode: Literal["async", "sync"] = "async"
    steps: int = 300
    rollout_loops: int = 2
    seed: int = 0
    window: int = 64
    eval_every: int = 20
    eval_prompts: int = 8
    log_every: int = 10
    out_dir: str = "runs/async-grpo"
    stop_at_reward: float = 0.0
    max_minutes: float = 10.0


def _convert(key: str, raw: str, tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        if raw not in choices:
            raise ConfigError(f"{key}: {raw!r} is not one of {list(choices)}")
        return raw
    if origin in (typing.Union, types.UnionType):
        raise ConfigError(f"{key}: unsupported union type")  # not used by any field
    if tp is bool:
        if raw.lower() in ("true", "1", "yes"):
            return True
        if raw.lower() in ("false", "0", "no"):
            return False
        raise ConfigError(f"{key}: expected true or false, got {raw!r}")
    if tp in (int, float):
        try:
            return tp(raw)
        except ValueError:
            raise ConfigError(f"{key}: expected {tp.__name__}, got {raw!r}") from None
    return raw


def apply_overrides(cfg: RunConfig, overrides: dict[str, str]) -> RunConfig:
    """Returns a copy of `cfg` with dotted keys (`trainer.lr`, `mode`) set from strings.

    Every key is checked and converted before anything is set, and `cfg` itself is never
    modified, so a bad override changes nothing.
    """
    out = copy.deepcopy(cfg)
    plan: list[tuple[object, str, Any]] = []
    for key, raw in overrides.items():
        *path, name = key.split(".")
        target: object = out
        for part in path:
            fields = {f.name for f in dataclasses.fields(target)}  # type: ignore[arg-type]
            child = getattr(target, part) if part in fields else None
            if child is None or not dataclasses.is_dataclass(child):
                raise _unknown_key(key, cfg)
            target = child
        hints = typing.get_type_hints(type(target))
        if name not in hints or dataclasses.is_dataclass(getattr(target, name)):
            raise _unknown_key(key, cfg)
        plan.append((target, name, _convert(key, raw, hints[name])))
    for target, name, value in plan:
        setattr(target, name, value)
    return out


def config_keys(cfg: object, prefix: str = "") -> list[str]:
    """Every settable dotted key of a config dataclass (`trainer.lr`, `mode`, ...)."""
    keys: list[str] = []
    for f in dataclasses.fields(cfg):  # type: ignore[arg-type]
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            keys += config_keys(value, f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


def _unknown_key(key: str, cfg: RunConfig) -> ConfigError:
    close = difflib.get_close_matches(key, config_keys(cfg), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"unknown config key {key!r}{hint}")


def validate(cfg: RunConfig) -> None:
    """Raises `ConfigError` naming the first value out of range."""
    checks: list[tuple[bool, str]] = [
        (cfg.sampling.group_size >= 2, "sampling.group_size must be >= 2 (GRPO compares answers)"),
        (cfg.sampling.max_new_tokens >= 1, "sampling.max_new_tokens must be >= 1"),
        (cfg.sampling.temperature > 0, "sampling.temperature must be > 0"),
        (0 < cfg.sampling.top_p <= 1, "sampling.top_p must be in (0, 1]"),
        (cfg.trainer.lr > 0, "trainer.lr must be > 0"),
        (cfg.trainer.grad_clip > 0, "trainer.grad_clip must be > 0"),
        (0 < cfg.trainer.adam_beta2 < 1, "trainer.adam_beta2 must be in (0, 1)"),
        (cfg.trainer.clip_eps > 0, "trainer.clip_eps must be > 0"),
        (cfg.trainer.truncate_cap >= 1, "trainer.truncate_cap must be >= 1"),
        (cfg.trainer.kl_coef >= 0, "trainer.kl_coef must be >= 0"),
        (cfg.trainer.entropy_coef >= 0, "trainer.entropy_coef must be >= 0"),
        (cfg.trainer.warmup_steps >= 0, "trainer.warmup_steps must be >= 0"),
        (0 <= cfg.trainer.min_lr_ratio <= 1, "trainer.min_lr_ratio must be in [0, 1]"),
        (cfg.trainer.procs >= 1, "trainer.procs must be >= 1"),
        (
            cfg.trainer.batch_size // max(1, cfg.sampling.group_size) >= cfg.trainer.procs,
            "trainer.procs must be <= the groups per batch (batch_size / group_size): "
            "every trainer rank trains on at least one whole group",
        ),
        (
            cfg.trainer.batch_size >= cfg.sampling.group_size
            and cfg.trainer.batch_size % cfg.sampling.group_size == 0,
            "trainer.batch_size must be a positive multiple of sampling.group_size",
        ),
        (cfg.buffer.max_policy_age >= 0, "buffer.max_policy_age must be >= 0"),
        (cfg.buffer.capacity >= cfg.trainer.batch_size, "buffer.capacity must be >= batch_size"),
        (cfg.generator.replicas >= 1, "generator.replicas must be >= 1"),
        (cfg.generator.prompts_per_call >= 1, "generator.prompts_per_call must be >= 1"),
        (cfg.reward.replicas >= 1, "reward.replicas must be >= 1"),
        (cfg.rollout_loops >= 1, "rollout_loops must be >= 1"),
        (cfg.steps >= 1, "steps must be >= 1"),
        (cfg.window >= 1, "window must be >= 1"),
        (cfg.eval_every >= 0, "eval_every must be >= 0 (0 turns evaluation off)"),
        (cfg.eval_prompts >= 1, "eval_prompts must be >= 1"),
        (1 <= cfg.data.min_n <= cfg.data.max_n, "data.min_n must be in [1, data.max_n]"),
        (cfg.max_minutes > 0, "max_minutes must be > 0"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
