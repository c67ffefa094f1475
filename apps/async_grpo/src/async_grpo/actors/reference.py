"""The reference model actor: a frozen copy of the initial policy, for the KL term."""

from __future__ import annotations

import torch
from monarch.actor import Actor, endpoint

from async_grpo.batching import Rollout, pack, sequence_logprobs
from async_grpo.config import SamplingConfig
from async_grpo.model import load_policy, load_tokenizer


class ReferenceModel(Actor):
    """Per-token log-probs of responses under the initial weights (never updated)."""

    def __init__(self, model_path: str, sampling: SamplingConfig) -> None:
        torch.set_num_threads(1)
        self._model = load_policy(model_path)
        tokenizer = load_tokenizer(model_path)
        self._vocab, self._pad = len(tokenizer), int(tokenizer.pad_token_id or 0)
        self._sampling = sampling

    @endpoint
    async def logprobs(self, pairs: list[tuple[list[int], list[int]]]) -> list[list[float]]:
        """For each (prompt_ids, response_ids): the reference log-prob of every response token."""
        rollouts = [Rollout(p, r, [0.0] * len(r), 0.0) for p, r in pairs]
        batch = pack(rollouts, self._pad)
        with torch.no_grad():
            lp = sequence_logprobs(
                self._model, batch, self._sampling.temperature, self._sampling.top_p, self._vocab
            )
        return [lp[i, : len(r)].tolist() for i, (_, r) in enumerate(pairs)]
