"""Named presets: each is a function returning a complete `RunConfig`.

`tiny` (the default on every machine) trains a random-init 2-layer Qwen2 on "count to N";
`pattern`, `repeat` and `calculator` train it on multi-turn environments (`rl_envs`);
`qwen2.5-0.5b` runs the real instruct model from a local directory (or its architecture with
random weights) on arithmetic word problems, on a GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from async_grpo.config.schema import (
    BufferConfig,
    DataConfig,
    EnvConfig,
    GeneratorConfig,
    LossConfig,
    ModelConfig,
    RewardConfig,
    RunConfig,
    SamplingConfig,
    TrainerConfig,
)
from async_grpo.model.arch import QWEN25_05B_ARCH, ArchSpec

TINY_ARCH = ArchSpec(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)

ARCHS: dict[str, ArchSpec] = {"tiny": TINY_ARCH, "qwen2.5-0.5b": QWEN25_05B_ARCH}


def tiny() -> RunConfig:
    """CPU-sized: random-init Qwen2 (2 layers, width 128), word-level tokenizer, count to N."""
    return RunConfig(
        model=ModelConfig(path="", arch="tiny"),
        data=DataConfig(task="count", min_n=1, max_n=6),
        sampling=SamplingConfig(group_size=16, max_new_tokens=8, temperature=1.0, top_p=1.0),
        # One generator process and one trainer process, a core each on the 2-core machine
        # this preset is sized for (measured: a second replica there only contends with the
        # trainer, 1054 vs 1202 trained episodes/s); raise it on a bigger machine. A call
        # holds a whole batch (8 prompts x 16): sampled at once, 128 episodes took 43-49 ms
        # against 2 x 34 ms in two calls of 4 (traces of 400-step runs, apps/async_grpo/README.md).
        generator=GeneratorConfig(replicas=1, prompts_per_call=8),
        reward=RewardConfig(fns="count"),
        # Measured in apps/async_grpo/README.md ("Why these settings"): without the entropy
        # bonus the policy turns deterministic (entropy ~0.01 nats/token) before it can tell
        # N = 4, 5, 6 apart and stops after "3" or "4" for all of them; without the decay,
        # late updates can flip an answer it had right (count to 2: -> 1 2 3). beta2 0.99 is
        # meant to bound the Adam step after a quiet stretch of uniform groups; the sweeps
        # could not tell it from 0.999.
        trainer=TrainerConfig(
            lr=3e-4,
            adam_beta2=0.99,
            lr_schedule="cosine",
            warmup_steps=20,
            min_lr_ratio=0.1,
            batch_size=128,
            # One pass, each group's prompt run once and the responses packed (`share_prompts`,
            # the default): the step 1.46x-1.55x faster than the two length-sorted passes of
            # ~64 without sharing this preset had before; with sharing, two passes run each
            # prompt twice (measured in apps/async_grpo/README.md, "Async vs sync").
            micro_batch_tokens=0,
            loss=LossConfig(entropy_coef=0.1, kl_coef=0.0),
        ),
        buffer=BufferConfig(max_policy_age=1, capacity=1024),
        steps=800,
        rollout_loops=2,
        # The trainer was the slowest part on two shared cores: the other processes yield
        # to it (measured in apps/async_grpo/README.md, "Async vs sync"). Since a step runs
        # identical episodes once (`trainer.merge_identical`) the rollouts are, once the
        # policy repeats its answers; `--nice 0` read the same there (1.61x against 1.63x).
        nice=10,
        window=64,
        eval_every=40,
        max_minutes=20.0,
    )


def pattern() -> RunConfig:
    """The tiny model plays "follow the pattern" (`rl_envs.FollowThePattern`, level 0): two
    rules "when I say X, you say Y", then three cues, one answer a turn."""
    cfg = _word_game("pattern")
    # With GRPO's std-scaled advantages the policy commits to one word for a cue before it
    # can tell the cues apart, and stops there; MaxRL's mean scaling pulls a right answer
    # it rarely says back up, and it learns the lookup (both measured in docs/07). The
    # constant lr 1e-3 and the absent entropy bonus come from short trials, not measured
    # one by one.
    cfg.trainer.advantage_scale = "mean"
    cfg.trainer.lr = 1e-3
    cfg.trainer.lr_schedule = "constant"
    cfg.trainer.loss = dataclasses.replace(cfg.trainer.loss, entropy_coef=0.0)
    # It finds the lookup late, at a step that varies from run to run (docs/07): a
    # 30-minute budget, about 3400 steps on the 2-core machine.
    cfg.steps = 4000
    cfg.max_minutes = 30.0
    cfg.eval_every = 100
    cfg.eval_prompts = 32
    return cfg


def repeat() -> RunConfig:
    """The tiny model plays "repeat after me" (`rl_envs.RepeatAfterMe`, level 0): two words,
    one a turn."""
    return _word_game("repeat")


def _word_game(env: str) -> RunConfig:
    cfg = tiny()
    # Each cue is answered on its own, and an answer does not change the next cue: a turn
    # is credited with its own reward only (measured in docs/07_environments.md).
    cfg.env = EnvConfig(tasks=env, credit="turn", turn_discount=0.0)
    # A turn is one token: one word of the word-level vocabulary (a random model almost
    # never ends a longer turn right after the word, and then no answer is ever right).
    cfg.sampling.max_new_tokens = 1
    return cfg


def calculator() -> RunConfig:
    """The tiny model uses a tool: it writes the question's computation ("Compute 7 times 4
    with Python.") as a Python expression, the bubblewrap sandbox runs it, and the reward
    comes from what it printed (`rl_envs.Calculator`, level 0: two numbers, one attempt).
    Needs `bubblewrap`."""
    cfg = tiny()
    cfg.env = EnvConfig(tasks="calculator", replicas=1)
    # A level-0 answer is three words ("7 * 4"): a random model that must also end its turn
    # ends it after one number far more often than after three, and stays there (measured
    # in docs/07_environments.md).
    cfg.sampling.max_new_tokens = 3
    # It learns late (the right operators after about 400 steps, measured in
    # docs/07_environments.md), when a cosine decay has already cut the step size.
    cfg.trainer.lr_schedule = "constant"
    # With std scaling the policy settles on one operator or order where it cannot yet
    # tell them apart and stops near 0.75. Mean scaling (MaxRL) pulls a rarely-said right
    # answer back up, measured from the group's lowest reward so that the partial credit
    # every wrong answer earns does not dilute it (docs/07).
    cfg.trainer.advantage_scale = "mean"
    cfg.steps = 1200
    cfg.eval_prompts = 32
    return cfg


def qwen25_05b() -> RunConfig:
    """Qwen/Qwen2.5-0.5B-Instruct (hub id or local directory) on arithmetic word problems."""
    return RunConfig(
        model=ModelConfig(
            path="Qwen/Qwen2.5-0.5B-Instruct",
            arch="qwen2.5-0.5b",
            chat_template=True,
            dtype="bfloat16",
        ),
        data=DataConfig(task="arithmetic", min_n=2, max_n=50),
        sampling=SamplingConfig(group_size=8, max_new_tokens=32, temperature=1.0, top_p=1.0),
        generator=GeneratorConfig(replicas=1, prompts_per_call=8),
        reward=RewardConfig(fns="numeric:0.9,format:0.1"),
        trainer=TrainerConfig(lr=1e-6, batch_size=64, loss=LossConfig(kl_coef=0.01)),
        buffer=BufferConfig(max_policy_age=1, capacity=512),
        steps=200,
        rollout_loops=2,
        window=64,
        max_minutes=60.0,
        device="cuda",  # sized for a GPU: refused on a machine without one (--device cpu runs it)
    )


PRESETS: dict[str, Callable[[], RunConfig]] = {
    "tiny": tiny,
    "pattern": pattern,
    "repeat": repeat,
    "calculator": calculator,
    "qwen2.5-0.5b": qwen25_05b,
}


DEFAULT_PRESET = "tiny"
"""What `uv run async-grpo` runs on every machine, with or without CUDA (nothing downloaded);
the Qwen preset is asked for by name."""
