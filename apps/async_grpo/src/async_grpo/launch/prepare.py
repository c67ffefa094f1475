"""Everything checked and built in the controller before any process is spawned: the
config's ranges, the reward spec, W&B installed when asked for, the dataset (a malformed
file fails here, with its line number), the output directory and the checkpoint directory
every process will load.

Checks run from the most basic to the most costly, and nothing is written until every
check has passed: a rejected run leaves no directory behind.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch
from transformers import AutoConfig, PretrainedConfig

from async_grpo.config.presets import ARCHS
from async_grpo.config.schema import ConfigError, RunConfig
from async_grpo.config.validate import validate
from async_grpo.generation.engines import check_engine
from async_grpo.launch.devices import DeviceError, DeviceMap, plan_devices
from async_grpo.launch.launchers import check_launcher
from async_grpo.launch.placement import Demand, PlacementError, PlacementPlan, plan_placement
from async_grpo.model.locate import ModelNotFound, locate_model
from async_grpo.model.lora import check_targets
from async_grpo.model.policy import built_checkpoint, qwen2_config, write_random_checkpoint
from async_grpo.observability import wandb_run
from async_grpo.tasks.environments import check_env_config, env_corpus, parse_env_weights
from async_grpo.tasks.prompts import Sample, corpus_for, load_hf_dataset, load_jsonl
from async_grpo.tasks.rewards import parse_weights


@dataclasses.dataclass(frozen=True)
class Prepared:
    """`model_path`: a directory (or hub id) every actor loads with `from_pretrained`;
    `samples`: the dataset when it comes from a file or HF, None for a generated task;
    `placement`: where each component runs; `devices`: which GPUs each process uses."""

    model_path: str
    samples: list[Sample] | None
    placement: PlacementPlan
    devices: DeviceMap


def _reason(e: Exception) -> str:
    """An OS error as its reason alone ("Permission denied"), anything else as its text."""
    return e.strerror if isinstance(e, OSError) and e.strerror else str(e)


def load_samples(cfg: RunConfig) -> list[Sample] | None:
    """The dataset of `data.path` or `data.hf_name`; None for a generated task."""
    d = cfg.data
    key = "data.path" if d.path else "data.hf_name"
    if d.path and Path(d.path).is_dir():
        raise ConfigError(f"data.path: {d.path} is a directory, not a JSONL file")
    try:
        if d.path:
            return load_jsonl(Path(d.path), d.prompt_key, d.target_key, d.format)
        if d.hf_name:
            return load_hf_dataset(d.hf_name, d.hf_split, d.prompt_key, d.target_key, fmt=d.format)
    except (OSError, ValueError, RuntimeError) as e:
        raise ConfigError(f"{key}: {_reason(e)}") from None
    return None


def make_out_dir(cfg: RunConfig) -> Path:
    """Creates `out_dir` (and its parents) if needed; an error names the key and why."""
    out = Path(cfg.out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out_dir: {out} exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"out_dir: cannot create {out}: {_reason(e)}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ConfigError(f"out_dir: {out} is not writable")
    return out


def check_generator(cfg: RunConfig, devices: DeviceMap) -> None:
    """The generation engine can start here: known, installed, its KV cache fits (the model
    architecture is checked by vLLM itself as each replica starts)."""
    g = cfg.generator
    if g.tensor_parallel > 1 and g.engine != "vllm":
        raise ConfigError(
            f"generator.tensor_parallel {g.tensor_parallel} needs --generator.engine vllm"
        )
    problem = check_engine(
        g.engine, replicas=g.replicas, kv_cache_gib=g.kv_cache_gib, on_gpu=devices.on_gpu
    )
    if problem is not None:
        raise ConfigError(f"generator.engine {g.engine}: {problem}")


def check_lora(cfg: RunConfig, model_path: str | None) -> None:
    """With LoRA on, every target module names a linear layer of the model (`model_path`'s
    config, or with None the architecture a random checkpoint is built of)."""
    lora = cfg.trainer.lora
    if not lora.enabled:
        return
    config: PretrainedConfig
    if model_path is None:
        config = qwen2_config(ARCHS[cfg.model.arch], None)
    else:
        try:
            config = AutoConfig.from_pretrained(model_path)
        except (OSError, ValueError) as e:
            raise ConfigError(f"model: cannot read the config of {model_path}: {e}") from None
    try:
        check_targets(config, lora)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def plan_gpus(cfg: RunConfig, placement: PlacementPlan) -> DeviceMap:
    """Which GPUs each process uses (`devices.plan_devices`), from this machine's GPUs."""
    g = cfg.generator
    try:
        return plan_devices(
            placement,
            local_gpus=torch.cuda.device_count(),
            device=cfg.device,
            trainer_procs=cfg.trainer.procs,
            generator_replicas=g.replicas,
            tensor_parallel=g.tensor_parallel,
            reference=cfg.trainer.loss.kl_coef > 0,
            kv_cache_gib=g.kv_cache_gib if g.engine == "vllm" else None,
        )
    except DeviceError as e:
        raise ConfigError(str(e)) from None


def plan_hosts(cfg: RunConfig) -> PlacementPlan:
    """`cfg.placement` checked against what this run starts, and the launcher's tools."""
    envs = len(parse_env_weights(cfg.env.tasks)) if cfg.env.tasks else 0
    demands = {
        "trainer": Demand(cfg.trainer.procs),
        "generator": Demand(cfg.generator.replicas),
        "reward": Demand(cfg.reward.replicas),
        "env": Demand(cfg.env.replicas if envs else 0, services=envs),
        "buffer": Demand(1),
        "dataset": Demand(1),
        "reference": Demand(1 if cfg.trainer.loss.kl_coef > 0 else 0),
    }
    try:
        plan = plan_placement(cfg.placement, demands)
        check_launcher(cfg.placement)
    except PlacementError as e:
        raise ConfigError(str(e)) from None
    return plan


def prepare(cfg: RunConfig) -> Prepared:
    """Validates `cfg` and builds what the processes need; raises before spawning anything."""
    validate(cfg)
    try:
        parse_weights(cfg.reward.fns)
    except ValueError as e:
        raise ConfigError(f"reward.fns: {e}") from None
    if cfg.metrics.wandb and (problem := wandb_run.missing()):
        raise ConfigError(f"metrics.wandb: {problem}")
    m = cfg.model
    build = m.random_weights or not m.path
    env_text: list[str] = []  # what the environments say, for a built tokenizer
    if cfg.env.tasks:
        try:
            weights = check_env_config(cfg.env, cfg.eval_prompts)
            env_text = env_corpus(weights) if build else []
        except ValueError as e:
            raise ConfigError(str(e)) from None
    if build and m.arch not in ARCHS:
        raise ConfigError(f"model.arch: unknown architecture {m.arch!r}; known: {sorted(ARCHS)}")
    placement = plan_hosts(cfg)
    devices = plan_gpus(cfg, placement)
    check_generator(cfg, devices)
    samples = load_samples(cfg)
    if not build:
        try:
            model_path = locate_model(m.path)
        except ModelNotFound as e:
            raise ConfigError(str(e)) from None
    check_lora(cfg, None if build else model_path)
    out_dir = make_out_dir(cfg)
    if build:
        # A random checkpoint of `arch`, with a tokenizer trained on the task's words.
        if env_text:
            corpus = env_text
        else:
            corpus = corpus_for(cfg.data.task, cfg.data.min_n, cfg.data.max_n, samples or ())
        path = built_checkpoint(out_dir, m.arch, m.init_seed)
        model_path = str(write_random_checkpoint(path, ARCHS[m.arch], corpus, seed=m.init_seed))
    return Prepared(model_path, samples, placement, devices)
