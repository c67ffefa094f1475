"""The reference model actor: a frozen copy of the initial policy, for the KL term, in the
policy's dtype on the trainer's GPU when it has one."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from monarch.actor import Actor, endpoint
from replay_buffer import Episode

from async_grpo import tracing
from async_grpo.actors.cores import ProcessSetup, settle_heap, share_cores
from async_grpo.config.schema import SamplingConfig
from async_grpo.grpo.batching import pack, sequence_logprobs_in_passes
from async_grpo.model.policy import load_policy, load_tokenizer, torch_device, torch_dtype


class ReferenceModel(Actor):
    """Per-token log-probs of responses under the initial weights (never updated)."""

    def __init__(
        self,
        model_path: str,
        sampling: SamplingConfig,
        dtype: str = "float32",
        device: str = "auto",
        micro_batch_tokens: int = 0,
        *,
        setup: ProcessSetup | None = None,
    ) -> None:
        # At the run's own priority (`setup.nice` 0): the loop waits on this process.
        share_cores(setup, "reference")
        tracing.start_from_env("reference")
        self._device = torch_device(device)
        # In the policy's dtype, on the trainer's GPU (`launch/devices.py`): on a CPU, a
        # 0.5B forward in float32 per step held every step for seconds.
        self._model = load_policy(model_path, torch_dtype(dtype)).to(self._device)  # type: ignore[arg-type]
        tokenizer = load_tokenizer(model_path)
        self._vocab, self._pad = len(tokenizer), int(tokenizer.pad_token_id or 0)
        self._sampling, self._micro_batch_tokens = sampling, micro_batch_tokens
        settle_heap()

    @endpoint
    async def logprobs(self, episodes: Sequence[Episode]) -> torch.Tensor:
        """[B, T] the reference log-prob of every response token of `episodes`, laid out as
        `batching.pack` lays out the same episodes (0 on padding)."""
        batch = pack(episodes, self._pad).to(self._device)
        with tracing.span("logprobs", episodes=len(episodes)):
            logprobs = sequence_logprobs_in_passes(
                self._model,
                batch,
                self._sampling.temperature,
                self._sampling.top_p,
                self._vocab,
                token_budget=self._micro_batch_tokens,
            )
        return logprobs.cpu()
