"""The trainer's core, the same for one process and for every rank of a sharded trainer: the
GRPO step on a batch of episodes, its guards, and the version it advances.

A data-parallel rank trains on its slice of the batch (`rank_rows`) but divides every
token's loss by the token count of the WHOLE batch and multiplies the result by the number
of ranks, so after FSDP averages the ranks' gradients the step equals the one a single
process would take on the whole batch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence

import torch
from replay_buffer import Episode
from torch import Tensor
from transformers import PreTrainedModel

from async_grpo.config.schema import SamplingConfig, TrainerConfig
from async_grpo.grpo.batching import (
    TrainBatch,
    identical_rows,
    micro_batches,
    pack,
    sequence_logprobs_and_entropy,
)
from async_grpo.grpo.loss import LossStats, grpo_loss


class NonFiniteError(RuntimeError):
    """A step's loss or gradient, or the weights about to be published, are not finite."""


@dataclasses.dataclass(frozen=True)
class StepStats:
    """One optimizer step: loss statistics (this rank's share when data-parallel), the
    gradient norm before clipping (global), the learning rate used, and the rows this rank
    ran through the model (its episodes, fewer where identical ones merged)."""

    loss: LossStats
    grad_norm: float
    lr: float
    rows: int


def make_optimizer(params: Iterable[torch.nn.Parameter], cfg: TrainerConfig) -> torch.optim.AdamW:
    """AdamW as the trainer config sets it (plain and sharded parameters alike)."""
    # Fused: one kernel per parameter instead of a dozen ops; on a CPU that is 0.5-1 ms a
    # step against ~3 ms for the tiny model's 26 tensors. DTensor shards support it too.
    return torch.optim.AdamW(
        params,
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        betas=(0.9, cfg.adam_beta2),
        fused=True,
    )


def learning_rate(cfg: TrainerConfig, step: int, total_steps: int) -> float:
    """The learning rate of optimizer step `step` (0-based) of `total_steps`.

    `lr_schedule="constant"`: `cfg.lr` throughout. `"cosine"`: linear warm-up over
    `warmup_steps`, then a cosine from `cfg.lr` down to `cfg.lr * min_lr_ratio` at the last
    step, where it stays (a run that goes past `total_steps` keeps the floor).
    """
    if cfg.lr_schedule == "constant":
        return cfg.lr
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, total_steps - 1 - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + (cfg.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def rank_rows(batch_size: int, group_size: int, rank: int, world_size: int) -> slice:
    """Data-parallel rank `rank`'s rows of a batch: a contiguous run of whole groups, the
    groups spread as evenly as `torch.chunk` would. Every rank must get at least one group
    (each runs the same collectives in its forward and backward pass)."""
    groups = batch_size // group_size
    if batch_size % group_size or groups < world_size:
        raise ValueError(
            f"{batch_size} episodes are not at least {world_size} whole groups of {group_size}"
        )
    base, extra = divmod(groups, world_size)
    first = rank * base + min(rank, extra)
    count = base + (1 if rank < extra else 0)
    return slice(first * group_size, (first + count) * group_size)


def add_stats(parts: Sequence[LossStats]) -> LossStats:
    """The whole batch's statistics from data-parallel ranks' shares (each normalised by the
    whole batch's token count, so they add up)."""
    fields = [f.name for f in dataclasses.fields(LossStats)]
    return LossStats(**{name: sum(getattr(p, name) for p in parts) for name in fields})


class TrainerCore:
    """The policy, its optimizer and its version; `step` trains on one batch.

    `rank` / `world_size` describe data parallelism (1 process: 0 / 1); the model is already
    sharded when `world_size > 1`. The version counts optimizer steps taken: 0 is the initial
    weights, and a refused step does not advance it.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        cfg: TrainerConfig,
        sampling: SamplingConfig,
        *,
        vocab_size: int,
        pad_id: int,
        total_steps: int,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.model, self.cfg, self.sampling = model, cfg, sampling
        # Dropout off: the loss compares these log-probs with the generator's (which samples
        # without dropout), so with it on not even a sync run would be on-policy. Gradients
        # flow the same in eval mode; nothing here reads `model.training` otherwise.
        model.train(False)
        self.vocab_size, self.pad_id, self.total_steps = vocab_size, pad_id, total_steps
        self.rank, self.world_size = rank, world_size
        # Only what trains: with LoRA adapters the base weights are frozen, and AdamW then
        # holds (and a checkpoint saves) the adapters' moments alone.
        self.trained = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = make_optimizer(self.trained, cfg)
        self.version = 0
        # Called right before the optimizer changes the weights: a checkpoint still copying
        # them (`trainer_state.CheckpointWriter.staged`) is waited for there, not earlier.
        self.before_update: Callable[[], None] = lambda: None

    def step(self, episodes: Sequence[Episode], ref_logprobs: Tensor | None) -> StepStats:
        """One GRPO step on this rank's rows of `episodes` (the whole batch, in group order;
        `ref_logprobs` [B, T] for the whole batch, or None). Raises `NonFiniteError`, with the
        weights and the version unchanged, when the loss or the gradient is not finite.

        The rows go through the model in micro-batches of at most
        `cfg.micro_batch_tokens` padded tokens (`batching.micro_batches`), their gradients
        summed: every token's loss is divided by the whole batch's token count, so the
        step is the one a single pass would take, up to float rounding. With
        `cfg.merge_identical` a set of identical episodes takes one row, its tokens weighted
        by their number (`batching.identical_rows`): the same step again."""
        whole = pack(episodes, self.pad_id, ref_logprobs)
        token_count = int(whole.response_mask.sum())
        budget, lens = self.cfg.micro_batch_tokens, whole.seq_lens
        ranks = [
            torch.arange(len(episodes))[
                rank_rows(len(episodes), self.sampling.group_size, r, self.world_size)
            ]
            for r in range(self.world_size)
        ]
        if self.cfg.merge_identical:
            count = torch.zeros(len(episodes), dtype=torch.long)
            for r, rows in enumerate(ranks):
                kept, counts = identical_rows(whole, rows)
                ranks[r], count[kept] = kept, counts
            whole = dataclasses.replace(whole, count=count)
        # Every rank runs the same collectives in each pass, so all make as many passes as
        # the rank that needs the most.
        passes = max(len(micro_batches(lens[r], budget)) for r in ranks)
        mine = ranks[self.rank]
        plan = [mine[run] for run in micro_batches(lens[mine], budget, at_least=passes)]
        device = next(self.model.parameters()).device
        self.optimizer.zero_grad(set_to_none=True)
        parts = []
        for rows in plan:
            loss, part = self._loss(whole.select(rows).to(device), token_count)
            # Backward even when the loss is not finite: every rank must run the same
            # collectives, and the global gradient norm then tells every rank to refuse it.
            (loss * self.world_size).backward()  # type: ignore[no-untyped-call]
            parts.append(part)
        for _ in range(passes - len(plan)):
            # Fewer rows than another rank's passes: one row weighted 0 keeps the
            # collectives in step without changing the gradient.
            loss, _ = self._loss(whole.select(plan[0][:1]).to(device), token_count)
            (loss * 0.0).backward()  # type: ignore[no-untyped-call]
        stats = add_stats(parts)
        lr = learning_rate(self.cfg, self.version, self.total_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        norm = torch.nn.utils.clip_grad_norm_(self.trained, self.cfg.grad_clip)
        grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        if not (math.isfinite(stats.loss) and math.isfinite(grad_norm)):
            self.optimizer.zero_grad(set_to_none=True)
            what = f"the loss is {stats.loss}" if not math.isfinite(stats.loss) else ""
            what = what or f"the gradient norm is {grad_norm}"
            raise NonFiniteError(
                f"train step {self.version + 1}: {what}; the step was refused, the weights "
                f"are unchanged and version {self.version} stays the newest published"
            )
        self.before_update()
        self.optimizer.step()
        self.version += 1
        return StepStats(stats, grad_norm, lr, rows=len(mine))

    def _loss(self, batch: TrainBatch, token_count: int) -> tuple[Tensor, LossStats]:
        """The GRPO loss of one pass over `batch`, every token divided by `token_count`."""
        lp, entropy = sequence_logprobs_and_entropy(
            self.model,
            batch,
            self.sampling.temperature,
            self.sampling.top_p,
            self.vocab_size,
            share_prompts=self.cfg.share_prompts,
        )
        loss_cfg = self.cfg.loss
        return grpo_loss(
            lp,
            batch.behavior_logprobs,
            batch.advantages,
            batch.loss_weight,
            loss_cfg,
            ref_logprobs=batch.ref_logprobs,
            token_count=token_count,
            entropy=entropy if loss_cfg.entropy_coef > 0 else entropy.detach(),
        )


def check_finite(state: dict[str, Tensor], version: int) -> None:
    """Raises `NonFiniteError` naming the first tensor of `state` holding a NaN or an
    infinity (DTensors: this rank's shard), so such weights are never published."""
    local = {n: t.to_local() if hasattr(t, "to_local") else t for n, t in state.items()}
    tensors = [t for t in local.values() if t.is_floating_point()]
    if not tensors or bool(torch.stack(torch._foreach_norm(tensors)).isfinite().all()):
        return
    # A norm can overflow on finite weights: only a tensor that really holds one is refused.
    bad = next(
        (n for n, t in local.items() if t.is_floating_point() and not t.isfinite().all()), None
    )
    if bad is None:
        return
    raise NonFiniteError(f"version {version}: weight {bad!r} is not finite; it was not published")
