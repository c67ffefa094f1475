"""The sampling distribution's log-probs."""

from __future__ import annotations

import torch
from torch import Tensor


def masked_logits(
    logits: Tensor, temperature: float, top_p: float, vocab_size: int, keep: Tensor | None = None
) -> Tensor:
    """The sampling distribution's logits: scaled by 1/temperature, limited to `vocab_size`
    real tokens and to the top-p nucleus (everything else is -inf).

    `keep` (same shape as `logits` without the last dim) names a token that must stay in the
    support; the trainer passes the sampled token so a stale policy never gives it -inf.
    """
    scaled = logits[..., :vocab_size].float() / temperature
    if top_p >= 1.0:
        return scaled
    probs = torch.softmax(scaled, dim=-1)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    # A token stays if the mass strictly before it is below top_p: the smallest nucleus.
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    drop_sorted = before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    if keep is not None:
        drop.scatter_(-1, keep.unsqueeze(-1), False)
    return scaled.masked_fill(drop, float("-inf"))


def token_logprobs(
    logits: Tensor, tokens: Tensor, temperature: float, top_p: float, vocab_size: int
) -> Tensor:
    """Log-prob of `tokens` [...] under the sampling distribution of `logits` [..., V]."""
    return token_logprobs_and_entropy(logits, tokens, temperature, top_p, vocab_size)[0]


def token_logprobs_and_entropy(
    logits: Tensor, tokens: Tensor, temperature: float, top_p: float, vocab_size: int
) -> tuple[Tensor, Tensor]:
    """`token_logprobs`, and the entropy (nats) of the sampling distribution at each of
    those positions: how much the policy still explores there."""
    dist = masked_logits(logits, temperature, top_p, vocab_size, keep=tokens)
    logp = torch.log_softmax(dist, dim=-1)
    # Tokens outside the nucleus have probability 0 and log-prob -inf: they add 0. The -inf
    # is replaced before the product, not after: masking exp(logp) * logp afterwards hides the
    # forward NaN (0 * -inf) but not the backward one, which reached every weight.
    finite_logp = torch.where(torch.isfinite(logp), logp, torch.zeros_like(logp))
    plogp = logp.exp() * finite_logp
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1), -plogp.sum(-1)
