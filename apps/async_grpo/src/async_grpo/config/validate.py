"""`validate`: every range and relation of a `RunConfig`, checked before anything starts."""

from __future__ import annotations

import functools

from async_grpo.config.schema import ConfigError, RunConfig


def validate(cfg: RunConfig) -> None:
    """Raises `ConfigError` naming the first problem: each field's own range first, then
    how fields fit together (so `--trainer.batch_size 0` is about the batch size, not about
    the groups it would hold)."""
    d, s, t, loss = cfg.data, cfg.sampling, cfg.trainer, cfg.trainer.loss
    inf = float("inf")
    ranges: list[tuple[str, bool, str]] = [
        ("steps", cfg.steps >= 1, ">= 1"),
        ("rollout_loops", cfg.rollout_loops >= 1, ">= 1"),
        ("window", cfg.window >= 1, ">= 1"),
        ("eval_every", cfg.eval_every >= 0, ">= 0 (0 turns evaluation off)"),
        ("eval_prompts", cfg.eval_prompts >= 1, ">= 1"),
        ("log_every", cfg.log_every >= 1, ">= 1"),
        ("out_dir", bool(cfg.out_dir.strip()), "a directory path"),
        ("stop_at_reward", cfg.stop_at_reward >= 0, ">= 0 (0: never stop early)"),
        ("max_minutes", cfg.max_minutes > 0, "> 0"),
        ("data.min_n", d.min_n >= 1, ">= 1"),
        ("sampling.group_size", s.group_size >= 2, ">= 2 (GRPO compares answers)"),
        ("sampling.max_new_tokens", s.max_new_tokens >= 1, ">= 1"),
        ("sampling.temperature", s.temperature > 0, "> 0"),
        ("sampling.top_p", 0 < s.top_p <= 1, "in (0, 1]"),
        ("generator.replicas", cfg.generator.replicas >= 1, ">= 1"),
        ("generator.prompts_per_call", cfg.generator.prompts_per_call >= 1, ">= 1"),
        ("generator.kv_cache_gib", 0 < cfg.generator.kv_cache_gib < float("inf"), "> 0"),
        ("generator.tensor_parallel", cfg.generator.tensor_parallel >= 1, ">= 1"),
        ("generator.kv_block_tokens", cfg.generator.kv_block_tokens >= 0, ">= 0 (0: vLLM's)"),
        ("reward.replicas", cfg.reward.replicas >= 1, ">= 1"),
        ("trainer.lr", 0 < t.lr < float("inf"), "> 0 and finite"),
        ("trainer.adam_beta2", 0 < t.adam_beta2 < 1, "in (0, 1)"),
        ("trainer.warmup_steps", t.warmup_steps >= 0, ">= 0"),
        ("trainer.min_lr_ratio", 0 <= t.min_lr_ratio <= 1, "in [0, 1]"),
        ("trainer.weight_decay", 0 <= t.weight_decay < float("inf"), ">= 0 and finite"),
        ("trainer.grad_clip", t.grad_clip > 0, "> 0"),
        ("trainer.batch_size", t.batch_size >= 1, ">= 1"),
        ("trainer.micro_batch_tokens", t.micro_batch_tokens >= 0, ">= 0 (0: one pass)"),
        ("trainer.procs", t.procs >= 1, ">= 1"),
        ("trainer.lora.rank", t.lora.rank >= 0, ">= 0 (0: no adapters)"),
        ("trainer.lora.alpha", t.lora.alpha > 0, "> 0"),
        ("trainer.lora.dropout", 0 <= t.lora.dropout < 1, "in [0, 1)"),
        ("trainer.step_timeout_s", 0 <= t.step_timeout_s < inf, ">= 0 (0: from the steps)"),
        ("trainer.call_timeout_s", 0 < t.call_timeout_s < inf, "> 0"),
        ("trainer.loss.clip_eps", loss.clip_eps > 0, "> 0"),
        ("trainer.loss.truncate_cap", loss.truncate_cap >= 1, ">= 1"),
        ("trainer.loss.kl_coef", loss.kl_coef >= 0, ">= 0 (0 turns the KL term off)"),
        ("trainer.loss.entropy_coef", loss.entropy_coef >= 0, ">= 0"),
        ("buffer.max_policy_age", cfg.buffer.max_policy_age >= 0, ">= 0"),
        ("buffer.capacity", cfg.buffer.capacity >= 1, ">= 1"),
        ("buffer.warmup_episodes", cfg.buffer.warmup_episodes >= 0, ">= 0 (0: no warm-up)"),
        ("env.level", cfg.env.level >= 0, ">= 0"),
        ("env.curriculum", 0 <= cfg.env.curriculum <= 1, "in [0, 1] (0: the level stays)"),
        ("env.replicas", cfg.env.replicas >= 1, ">= 1"),
        ("env.max_turns", cfg.env.max_turns >= 1, ">= 1"),
        ("env.step_timeout_s", 0 < cfg.env.step_timeout_s < float("inf"), "> 0"),
        ("env.turn_discount", 0.0 <= cfg.env.turn_discount <= 1.0, "in [0, 1]"),
        ("env.call_timeout_s", 0 <= cfg.env.call_timeout_s < inf, ">= 0 (0: none)"),
        ("generator.call_timeout_s", 0 <= cfg.generator.call_timeout_s < inf, ">= 0 (0: none)"),
        ("nice", 0 <= cfg.nice <= 19, "in 0..19 (a Linux nice value)"),
        ("reward.call_timeout_s", 0 <= cfg.reward.call_timeout_s < inf, ">= 0 (0: none)"),
        ("checkpoint.every", cfg.checkpoint.every >= 1, ">= 1 (train steps between checkpoints)"),
        ("checkpoint.keep", cfg.checkpoint.keep >= 1, ">= 1"),
        ("max_restarts", cfg.max_restarts >= 0, ">= 0"),
        (
            "metrics.wandb",
            not set(cfg.metrics.wandb) & set("/\\#?%:") and len(cfg.metrics.wandb) <= 128,
            "a W&B project name: at most 128 characters, none of / \\ # ? % :",
        ),
    ]
    for key, ok, rule in ranges:
        if not ok:
            value = functools.reduce(getattr, key.split("."), cfg)
            raise ConfigError(f"{key} must be {rule}, got {value!r}")
    groups = t.batch_size // s.group_size
    relations: list[tuple[bool, str]] = [
        (d.min_n <= d.max_n, f"data.max_n ({d.max_n}) must be >= data.min_n ({d.min_n})"),
        (
            not (d.path and d.hf_name),
            "data.path and data.hf_name are both set; give one dataset",
        ),
        (
            d.format == "jsonl" or bool(d.path or d.hf_name),
            f"data.format {d.format} reads a dataset: give --data.path FILE (or --data.hf_name)",
        ),
        (
            not (cfg.env.tasks and (d.path or d.hf_name)),
            "env.tasks and a dataset (data.path / data.hf_name) are both set; a run trains "
            "on environments or on prompts",
        ),
        (
            t.batch_size % s.group_size == 0 and groups >= 1,
            f"trainer.batch_size ({t.batch_size}) must be a positive multiple of "
            f"sampling.group_size ({s.group_size}): a batch holds whole groups",
        ),
        (
            cfg.mode == "sync" or cfg.buffer.max_policy_age >= 1,
            "buffer.max_policy_age 0 in async mode: use --mode sync (the same bound, with "
            "exactly one batch of prompts generated per version)",
        ),
        (
            t.procs <= groups,
            f"trainer.procs ({t.procs}) must be <= the groups per batch "
            f"(trainer.batch_size / sampling.group_size = {groups}): every trainer rank "
            "trains on at least one whole group",
        ),
        (
            not (t.lora.enabled and t.sharded),
            f"trainer.lora.rank {t.lora.rank} with trainer.procs {t.procs}: LoRA runs on one "
            "trainer process (its optimizer state is the adapters' alone); use "
            "--trainer.procs 1",
        ),
        (
            cfg.buffer.capacity >= t.batch_size,
            f"buffer.capacity ({cfg.buffer.capacity}) must be >= trainer.batch_size "
            f"({t.batch_size}): a whole batch has to fit in the buffer",
        ),
        (
            cfg.buffer.warmup_episodes <= cfg.buffer.capacity,
            f"buffer.warmup_episodes ({cfg.buffer.warmup_episodes}) must be <= "
            f"buffer.capacity ({cfg.buffer.capacity}): the warm-up fill waits in the buffer",
        ),
    ]
    for ok, message in relations:
        if not ok:
            raise ConfigError(message)
