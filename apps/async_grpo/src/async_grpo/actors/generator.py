"""The generator actor (one replica of the generator service): samples and takes new weights.

A plain Monarch endpoint runs one message at a time, so `update_weights` can never land in
the middle of a `generate`: each batch runs on exactly one policy version.
"""

from __future__ import annotations

import os

import torch
from monarch.actor import Actor, endpoint

from async_grpo import weight_sync
from async_grpo.config import ModelConfig, SamplingConfig
from async_grpo.model import load_policy, load_tokenizer
from async_grpo.sampling import Completion, generate
from async_grpo.weight_sync import WeightSync, WeightUpdate


class Generator(Actor):
    """Loads the policy from `model_path` with `from_pretrained` and samples from it."""

    def __init__(
        self, model_path: str, model: ModelConfig, sampling: SamplingConfig, seed: int
    ) -> None:
        torch.set_num_threads(1)  # many small processes share the cores
        dtype = torch.bfloat16 if model.dtype == "bfloat16" else torch.float32
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self._model = load_policy(model_path, dtype).to(device)  # type: ignore[arg-type]
        self._tokenizer = load_tokenizer(model_path)
        self._sampling = sampling
        self._chat = model.chat_template
        self._version = 0
        # Replicas get the same arguments; the pid keeps their samples independent.
        self._rng = torch.Generator(device).manual_seed(seed * 1_000_003 + os.getpid())

    @endpoint
    async def generate(self, prompts: list[str]) -> list[list[Completion]]:
        """`sampling.group_size` completions per prompt, all from the current version."""
        return generate(
            self._model,
            self._tokenizer,
            prompts,
            self._sampling,
            self._version,
            chat_template=self._chat,
            generator=self._rng,
        )

    @endpoint
    async def update_weights(self, update: WeightUpdate) -> WeightSync:
        """Pulls `update` (or a newer staged version), all or nothing."""
        result = await weight_sync.pull(update, self._model)
        self._version = result.version
        return result

    @endpoint
    async def weights(self) -> tuple[int, dict[str, torch.Tensor]]:
        """The version this replica runs and its parameters by name (for checks)."""
        params = {n: p.detach().cpu().clone() for n, p in self._model.named_parameters()}
        return self._version, params
