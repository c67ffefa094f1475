"""The reference model actor: a frozen copy of the initial policy, for the KL term."""

from __future__ import annotations

import torch
from monarch.actor import Actor, endpoint
from replay_buffer import Episode

from async_grpo import tracing
from async_grpo.config.schema import SamplingConfig
from async_grpo.grpo.batching import pack, sequence_logprobs
from async_grpo.model.policy import load_policy, load_tokenizer


class ReferenceModel(Actor):
    """Per-token log-probs of responses under the initial weights (never updated)."""

    def __init__(self, model_path: str, sampling: SamplingConfig) -> None:
        torch.set_num_threads(1)
        tracing.start_from_env("reference")
        self._model = load_policy(model_path)
        tokenizer = load_tokenizer(model_path)
        self._vocab, self._pad = len(tokenizer), int(tokenizer.pad_token_id or 0)
        self._sampling = sampling

    @endpoint
    async def logprobs(self, episodes: list[Episode]) -> torch.Tensor:
        """[B, T] the reference log-prob of every response token of `episodes`, laid out as
        `batching.pack` lays out the same episodes (0 on padding)."""
        batch = pack(episodes, self._pad)
        with tracing.span("logprobs", episodes=len(episodes)), torch.no_grad():
            return sequence_logprobs(
                self._model, batch, self._sampling.temperature, self._sampling.top_p, self._vocab
            )
