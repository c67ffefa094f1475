"""Typed configuration: one dataclass per component, one `RunConfig` holding them all.

Every field has a one-line docstring, which `--help` shows with the field's default
(`config.args.parse` builds the command line from these classes with `tyro`). `validate`
checks ranges and how the fields fit together, raising a `ConfigError` naming the key; it
runs in the controller before any process is spawned. Values derived from several fields
are properties of `RunConfig`, computed there and nowhere else.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

import tyro

from async_grpo.config.placement import PlacementConfig

ImportanceMode = Literal["clip", "truncate"]

DataFormat = Literal["jsonl", "gsm8k", "math"]
"""How a dataset's rows hold a prompt and its target (`tasks.formats`)."""


AdvantageScale = Literal["std", "mean", "none"]
"""What a group's centred rewards are divided by: "std" their standard deviation (GRPO),
"mean" their mean measured from the group's lowest reward, mean(r) - min(r) (MaxRL, Tajwar
et al. 2026, made shift-invariant: for 0/1 rewards it is MaxRL's mean, and the expected
update is the gradient of log P(success), the supervised gradient of the right answer),
"none" nothing."""


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """How the policy-gradient term is formed; ρ is the ratio of the current policy to the
    behavior policy that sampled the token.

    `importance="clip"`: PPO's clipped surrogate, min(ρA, clip(ρ, 1-ε, 1+ε)A).
    `importance="truncate"`: truncated importance weights, -min(ρ, `truncate_cap`)·A·log π
    with the weight held constant (no gradient through it). The entropy bonus keeps the
    policy exploring where a group would otherwise settle on one answer, since a group whose
    answers are all equal gives no gradient.
    """

    clip_eps: float = 0.2
    """ε of the clipped surrogate: ρ is clipped to [1 - ε, 1 + ε] (importance="clip")."""
    importance: ImportanceMode = "clip"
    """Off-policy correction: PPO-style "clip" or truncated importance weights "truncate"."""
    truncate_cap: float = 2.0
    """Largest importance weight (importance="truncate"), >= 1."""
    kl_coef: float = 0.0
    """Weight of the k3 KL to the reference model in the loss; 0 turns it off."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (mean entropy at the sampled positions, subtracted)."""


class ConfigError(ValueError):
    """A configuration value is unknown, ill-typed or out of range."""


@dataclasses.dataclass
class ModelConfig:
    """The policy: a checkpoint to load, or a random one of architecture `arch` built here."""

    path: Annotated[str, tyro.conf.arg(aliases=("--model",))] = ""
    """Local checkpoint directory or hub id; empty: build a random `arch` checkpoint."""
    arch: str = "tiny"
    """Architecture of a random checkpoint (`presets.ARCHS`): tiny or qwen2.5-0.5b."""
    random_weights: bool = False
    """Ignore `path`: build `arch` with random weights and a tokenizer trained on the task."""
    chat_template: bool = False
    """Wrap each prompt in the tokenizer's chat template (instruct models)."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype of the generators' copy of the policy."""
    init_seed: int = 0
    """Seed of the random weights of a built checkpoint."""


@dataclasses.dataclass
class DataConfig:
    """Prompts: a generated `task`, or a local JSONL `path`, or a Hugging Face `hf_name`, in
    `format`."""

    task: Literal["count", "arithmetic"] = "count"
    """Generated prompts when neither `path` nor `hf_name` is set."""
    min_n: int = 1
    """Smallest N of the generated task (count to N; operands of arithmetic)."""
    max_n: int = 6
    """Largest N of the generated task."""
    path: str = ""
    """JSONL file of prompts with targets, one object a line; empty: the generated task."""
    hf_name: str = ""
    """Hugging Face dataset name (instead of `path`); empty: none."""
    hf_split: str = "train"
    """Split of the Hugging Face dataset."""
    prompt_key: str = "prompt"
    """Key (JSONL) or column (HF) holding the prompt."""
    target_key: str = "target"
    """Key (JSONL) or column (HF) holding the expected answer."""
    format: DataFormat = "jsonl"
    """How a row holds its prompt and target: jsonl (`prompt_key` / `target_key` as they
    are), gsm8k (`question`, and `answer`'s text after `####`) or math (`problem`, and the
    last `\\boxed{...}` of `solution`); see `tasks.formats`."""


@dataclasses.dataclass
class EnvConfig:
    """Multi-turn environments (`rl_envs`). With `tasks` set, the run trains on whole
    episodes played against them (the model acts, the environment answers, until it says
    done) instead of on `data`'s prompts."""

    tasks: str = ""
    """Environments with weights, e.g. "pattern" or "repeat:1,pattern:2" (a task mixture:
    each group's environment drawn by weight); empty: the single-turn `data` task."""
    level: int = 0
    """Difficulty level every environment starts at."""
    curriculum: float = 0.0
    """Raise an environment's level when its evaluation's mean return reaches this, in
    (0, 1]; 0: the level stays."""
    replicas: int = 1
    """Replicas (processes) of each environment's service."""
    max_turns: int = 16
    """Policy turns after which an episode is cut (and trained on as it stands)."""
    step_timeout_s: float = 30.0
    """An environment's reset or step slower than this fails its episode (dropped, counted)."""
    call_timeout_s: float = 120.0
    """A call an environment replica leaves unanswered this long marks it hung: it is
    stopped and restarted (`actor-service`); 0: no timeout."""
    credit: Literal["episode", "turn"] = "episode"
    """What a policy turn is credited with: "episode", the group advantage of the episode's
    return (every turn alike); "turn", its own return's advantage over the other episodes'
    at the same turn (`grpo.advantages.turn_advantages`)."""
    turn_discount: float = 1.0
    """With credit "turn": the weight of the next turn's return in a turn's return, in
    [0, 1]; 0 credits a turn with its own reward only."""


@dataclasses.dataclass
class SamplingConfig:
    """How the generator samples, from softmax(logits / temperature) cut to the top-p nucleus."""

    group_size: int = 8
    """Responses sampled per prompt; GRPO compares them with each other."""
    max_new_tokens: int = 8
    """Longest response, in tokens."""
    temperature: float = 1.0
    """Softmax temperature of sampling (> 0)."""
    top_p: float = 1.0
    """Nucleus: sample from the smallest set of tokens with this much probability, in (0, 1]."""


@dataclasses.dataclass
class GeneratorConfig:
    """The generator service."""

    replicas: int = 2
    """Generator processes, each holding a copy of the policy."""
    prompts_per_call: int = 4
    """Prompts per generation request (each sampled `sampling.group_size` times)."""
    engine: Literal["hf", "vllm"] = "hf"
    """What samples: hf (transformers, built in) or vllm (needs `uv sync --extra vllm`)."""
    kv_cache_gib: float = 1.0
    """vllm: memory each replica reserves for its KV cache, GiB (RAM on CPU, GPU memory)."""
    tensor_parallel: int = 1
    """vllm: GPUs each replica's model is split over (1 on a CPU)."""
    kv_block_tokens: int = 0
    """vllm: tokens per KV-cache block (0: vLLM's choice); the prefix cache reuses whole blocks."""
    call_timeout_s: float = 300.0
    """A call (a batch, a turn, a weight load) a replica leaves unanswered this long marks
    it hung: it is stopped and restarted, the call sent to another (`actor-service`); 0: no
    timeout."""


@dataclasses.dataclass
class RewardConfig:
    """The reward service."""

    fns: str = "count"
    """Reward functions with weights, e.g. "count" or "numeric:0.9,format:0.1"."""
    replicas: int = 1
    """Reward processes."""
    call_timeout_s: float = 60.0
    """A scoring call a replica leaves unanswered this long marks it hung: it is stopped and
    restarted (`actor-service`); 0: no timeout."""


QWEN2_PROJECTIONS: tuple[str, ...] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)
"""The attention and MLP projections of a Qwen2 decoder layer: every linear layer but the
head. (Here and not in `model/lora.py`, which imports torch and transformers: every process
imports the config, and a process that never touches a model should not pay for them.)"""


@dataclasses.dataclass
class LoraConfig:
    """LoRA adapters (`peft`): with `rank > 0` the trainer trains low-rank adapters on
    `target_modules` and nothing else (the base weights frozen, AdamW holding the adapters
    alone), and a weight sync moves the adapters only (`model/lora.py`)."""

    rank: int = 0
    """Rank r of every adapter; 0: no adapters (every weight is trained)."""
    alpha: int = 16
    """Scale numerator: an adapter adds (alpha / rank) * B A to its layer's weight (> 0)."""
    dropout: float = 0.0
    """Dropout on each adapter's input, trainer side only, in [0, 1); > 0 makes even an
    on-policy importance ratio differ from 1."""
    target_modules: str = ",".join(QWEN2_PROJECTIONS)
    """Comma-separated module names (or dotted suffixes of them) that get an adapter; the
    default is every attention and MLP projection of a Qwen2 decoder layer."""

    @property
    def enabled(self) -> bool:
        """Adapters are trained instead of the whole model."""
        return self.rank > 0


@dataclasses.dataclass
class TrainerConfig:
    """GRPO trainer: AdamW on the token-level loss of `grpo.loss.grpo_loss`.

    `lr_schedule="cosine"`: linear warm-up over `warmup_steps`, then a cosine decay to
    `lr * min_lr_ratio` at the run's last step (`grpo.step.learning_rate`). `procs > 1` shards
    the trainer FSDP-style (every parameter a `Shard(0)` DTensor; gloo on CPU, nccl on GPU)
    and sends weights to the generators through `dtensor-reshard`; `procs == 1` is one
    process sending them through `rdma-tensor`."""

    lr: float = 1e-3
    """Peak learning rate of AdamW."""
    adam_beta2: float = 0.999
    """AdamW's second-moment decay, in (0, 1)."""
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """Learning-rate schedule over the run's steps."""
    warmup_steps: int = 0
    """Steps of linear warm-up (cosine schedule only)."""
    min_lr_ratio: float = 0.1
    """Final learning rate of the cosine schedule as a fraction of `lr`, in [0, 1]."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay."""
    grad_clip: float = 1.0
    """Maximum global gradient norm (> 0)."""
    batch_size: int = 64
    """Episodes per train step: a positive multiple of `sampling.group_size`."""
    micro_batch_tokens: int = 0
    """Most padded tokens (rows x longest prompt + response) one forward and backward pass
    holds: a step's episodes, sorted by length, go through the model in as few such passes
    as fit, their gradients summed (the same step, up to float rounding; a sequence longer
    than this goes alone). Bounds activation memory; on a CPU, shorter passes also pad less
    and stay in cache. 0: the whole batch (a rank's share) in one pass. The reference model
    passes its batches the same way."""
    share_prompts: bool = True
    """A prompt that several rows of a pass share (a GRPO group's) goes through the model
    once, and each row's response attends to that pass's keys and values: the same log-probs
    and gradient up to float rounding, with the prompt's tokens computed once a pass instead
    of once a row (the responses then in one pass, packed end to end into rows with no
    padding but the rows' ends: `grpo.packing`). False: every row runs its own prompt. The
    reference model always shares."""
    merge_identical: bool = True
    """Episodes of a step identical in everything the loss reads (a group that has learned
    its answer repeats it) go through the model once, each token's loss weighted by how many
    they are (`grpo.batching.identical_rows`): the same loss and gradient up to float
    rounding, from fewer rows. False: a row per episode."""
    advantage_scale: AdvantageScale = "std"
    """What a group's centred rewards are divided by: "std" (GRPO), "mean" (MaxRL's mean,
    measured from the group's lowest reward: for 0/1 rewards the supervised gradient in
    expectation) or "none" (`grpo.advantages.group_advantages`)."""
    procs: int = 1
    """Trainer processes; more than 1 shards the model FSDP-style over them."""
    step_timeout_s: float = 0.0
    """A train step left unanswered this long marks the trainer stuck: its stack is saved
    (`<out_dir>/stuck/`) and it is restored from the newest checkpoint, as after a death; 0:
    10 x the slowest step so far, at least 120 s (600 s for the first)."""
    call_timeout_s: float = 300.0
    """Any other call the trainer leaves unanswered this long (staging the first weights,
    taking or finishing a checkpoint, releasing staging): as `step_timeout_s`."""
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    """The GRPO loss (`LossConfig`); `loss.kl_coef > 0` also spawns a reference model."""
    lora: LoraConfig = dataclasses.field(default_factory=LoraConfig)
    """LoRA adapters (`LoraConfig`); `lora.rank > 0` trains adapters only."""

    @property
    def sharded(self) -> bool:
        """More than one trainer process: the model is sharded over them, and the weights go
        out through `dtensor-reshard` (whose staging waits for `release`)."""
        return self.procs > 1


@dataclasses.dataclass
class BufferConfig:
    """The replay buffer between generators and trainer."""

    max_policy_age: int = 1
    """Oldest policy version a trained episode may come from, in versions behind (async mode)."""
    capacity: int = 512
    """Episodes that may wait in the buffer; producers are held back beyond it."""
    warmup_episodes: int = 0
    """Episodes collected before the first train step (a warm-up fill); 0: train as soon
    as one batch is there."""
    drop_uniform_groups: bool = False
    """Drop a group whose advantages are all zero (its rewards were all equal: it teaches
    nothing) before it reaches the buffer, so batches fill with groups that teach something
    (DAPO's dynamic sampling); counted as filtered."""


@dataclasses.dataclass
class CheckpointConfig:
    """Checkpoints of the whole run (trainer, buffer, prompt position, metrics, config) under
    `<out_dir>/checkpoints/step-NNNNNN/`; `--resume` continues the newest (`disk`)."""

    every: int = 100
    """Train steps between checkpoints; one is also written at the end and on Ctrl-C/SIGTERM."""
    keep: int = 2
    """Newest complete checkpoints kept; an older one is deleted once a newer one is complete."""


@dataclasses.dataclass
class MetricsConfig:
    """Where a run's rows go besides `<out_dir>/metrics.jsonl` (and TensorBoard, when
    `tensorboard` is installed)."""

    wandb: str = ""
    """Weights & Biases project to log the run to: its rows, its config and, at the end, its
    report (needs `uv sync --extra wandb`); empty: none."""
    wandb_mode: Literal["auto", "online", "offline"] = "auto"
    """online: sent to the W&B server as the run goes; offline: kept in `<out_dir>/wandb/`
    (`wandb sync` uploads it later); auto: W&B's own choice (`WANDB_MODE`, else online)."""


@dataclasses.dataclass
class RunConfig:
    """A whole run: every component's settings and the loop's."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
    sampling: SamplingConfig = dataclasses.field(default_factory=SamplingConfig)
    generator: GeneratorConfig = dataclasses.field(default_factory=GeneratorConfig)
    reward: RewardConfig = dataclasses.field(default_factory=RewardConfig)
    trainer: TrainerConfig = dataclasses.field(default_factory=TrainerConfig)
    buffer: BufferConfig = dataclasses.field(default_factory=BufferConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = dataclasses.field(default_factory=MetricsConfig)
    placement: PlacementConfig = dataclasses.field(default_factory=PlacementConfig)
    """Which host mesh each component runs on, and the launcher that starts the hosts."""
    mode: Literal["async", "sync"] = "async"
    """async: generation runs ahead of training; sync: the same loop with max_policy_age 0."""
    device: Literal["auto", "cuda", "cpu"] = "auto"
    """Where the trainer, generators and reference compute: auto (the GPUs of their machine
    when it has any, else the CPU), cuda (refuse a machine without GPUs), cpu (the CPU
    even beside GPUs). Which GPU each takes: `launch/devices.py`."""
    steps: int = 300
    """Train steps (each one policy version)."""
    rollout_loops: int = 2
    """Concurrent rollout loops feeding the buffer."""
    nice: int = 0
    """Added to the Linux nice value (0-19) of the generator, dataset, reward and buffer
    processes: where they share CPU cores with the trainer, which is then the loop's
    slowest part, they yield to it and to the controller instead of preempting them (the
    tiny preset: 10)."""
    seed: int = 0
    """Seed of the dataset, sampling and trainer."""
    window: int = 64
    """Episodes in the running training reward."""
    eval_every: int = 20
    """Train steps between evaluations on the fixed eval prompts (plus one at the end); 0: none."""
    eval_prompts: int = 8
    """Most prompts in the eval set (`tasks.prompts.eval_set`; every N of the count task)."""
    log_every: int = 10
    """Train steps between report lines."""
    out_dir: str = "runs/async-grpo"
    """Directory for metrics.jsonl and built checkpoints (created if missing)."""
    stop_at_reward: float = 0.0
    """Stop once the windowed training reward reaches this; 0: never."""
    max_minutes: float = 10.0
    """Stop after this many minutes of training."""
    trace: bool = True
    """Record every process's spans into <out_dir>/trace.json (read by `async-grpo report`)."""
    max_restarts: int = 100
    """Restarts allowed per process over the run (each service replica; the trainer's
    restores from a checkpoint); beyond them a death ends the run."""

    @property
    def effective_max_policy_age(self) -> int:
        """The staleness bound the run uses: `buffer.max_policy_age` in async mode, 0 in sync
        mode (generation pauses until the trainer's new weights arrive)."""
        return self.buffer.max_policy_age if self.mode == "async" else 0
