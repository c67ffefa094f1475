"""Turning episodes into padded tensors, and recomputing their log-probs with a model.

The trainer and the reference model both call `sequence_logprobs`; it goes through
`sampling.token_logprobs`, the same distribution the generator sampled from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import Tensor
from transformers import PreTrainedModel

from async_grpo.sampling import token_logprobs_and_entropy


@dataclasses.dataclass(frozen=True)
class Rollout:
    """What the trainer needs of one episode (token ids, not text).

    `behaviour_logprobs` [R] are the generator's log-probs of `response_ids` [R];
    `ref_logprobs` [R] are the reference model's, or None when KL is off.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    behaviour_logprobs: list[float]
    advantage: float
    ref_logprobs: list[float] | None = None


@dataclasses.dataclass(frozen=True)
class TrainBatch:
    """B rollouts as right-padded tensors.

    `input_ids` [B, L] prompt then response then padding (L = longest prompt+response);
    `response_start` [B] index of each row's first response token; `response_mask` [B, T]
    (T = longest response) marks real response tokens; `behaviour_logprobs`, `ref_logprobs`
    [B, T]; `advantages` [B].
    """

    input_ids: Tensor
    attention_mask: Tensor
    response_start: Tensor
    response_mask: Tensor
    behaviour_logprobs: Tensor
    ref_logprobs: Tensor | None
    advantages: Tensor

    def to(self, device: torch.device) -> TrainBatch:
        """The same batch on `device` (a no-op where it already is)."""
        ref = self.ref_logprobs.to(device) if self.ref_logprobs is not None else None
        return TrainBatch(
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            response_start=self.response_start.to(device),
            response_mask=self.response_mask.to(device),
            behaviour_logprobs=self.behaviour_logprobs.to(device),
            ref_logprobs=ref,
            advantages=self.advantages.to(device),
        )


def pack(rollouts: Sequence[Rollout], pad_id: int) -> TrainBatch:
    """Pads `rollouts` into a `TrainBatch`."""
    if not rollouts:
        raise ValueError("pack: no rollouts")
    seq_len = max(len(r.prompt_ids) + len(r.response_ids) for r in rollouts)
    resp_len = max(len(r.response_ids) for r in rollouts)
    b = len(rollouts)
    input_ids = torch.full((b, seq_len), pad_id, dtype=torch.long)
    attention = torch.zeros((b, seq_len), dtype=torch.long)
    mask = torch.zeros((b, resp_len))
    behaviour = torch.zeros((b, resp_len))
    with_ref = all(r.ref_logprobs is not None for r in rollouts)
    ref = torch.zeros((b, resp_len)) if with_ref else None
    for i, r in enumerate(rollouts):
        ids = r.prompt_ids + r.response_ids
        input_ids[i, : len(ids)] = torch.tensor(ids)
        attention[i, : len(ids)] = 1
        n = len(r.response_ids)
        mask[i, :n] = 1.0
        behaviour[i, :n] = torch.tensor(r.behaviour_logprobs)
        if ref is not None and r.ref_logprobs is not None:
            ref[i, :n] = torch.tensor(r.ref_logprobs)
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention,
        response_start=torch.tensor([len(r.prompt_ids) for r in rollouts]),
        response_mask=mask,
        behaviour_logprobs=behaviour,
        ref_logprobs=ref,
        advantages=torch.tensor([r.advantage for r in rollouts]),
    )


def sequence_logprobs(
    model: PreTrainedModel, batch: TrainBatch, temperature: float, top_p: float, vocab_size: int
) -> Tensor:
    """[B, T] log-probs of each response token under `model`'s sampling distribution
    (0 on padding). Carries gradient when called outside `torch.no_grad`."""
    return sequence_logprobs_and_entropy(model, batch, temperature, top_p, vocab_size)[0]


def sequence_logprobs_and_entropy(
    model: PreTrainedModel, batch: TrainBatch, temperature: float, top_p: float, vocab_size: int
) -> tuple[Tensor, Tensor]:
    """`sequence_logprobs`, and [B, T] the sampling distribution's entropy at each response
    position (0 on padding); both carry gradient outside `torch.no_grad`."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    t = batch.response_mask.shape[1]
    # Row i's response token j sits at response_start[i] + j and is predicted one step before.
    idx = batch.response_start.unsqueeze(1) + torch.arange(t, device=logits.device).unsqueeze(0)
    idx = idx.clamp(max=batch.input_ids.shape[1] - 1)
    pred = logits.gather(1, (idx - 1).unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
    tokens = batch.input_ids.gather(1, idx)
    lp, entropy = token_logprobs_and_entropy(pred, tokens, temperature, top_p, vocab_size)
    return lp * batch.response_mask, entropy * batch.response_mask
