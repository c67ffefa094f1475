"""The generator actor (one replica of the generator service): samples and takes new weights.

A plain Monarch endpoint runs one message at a time, so `update_weights` can never land in
the middle of a `generate`: each batch runs on exactly one policy version. New weights come
from a one-process trainer through `rdma-tensor`, or from a sharded trainer through
`dtensor-reshard` (see `weight_sync.py`).
"""

from __future__ import annotations

import dataclasses
import os

import torch
from monarch.actor import Actor, endpoint
from rdma_tensor import pull

from async_grpo.config import ModelConfig, SamplingConfig
from async_grpo.model import load_policy, load_tokenizer
from async_grpo.sampling import Completion, generate
from async_grpo.weight_sync import ReshardReceiver, ShardedWeights, WeightUpdate


@dataclasses.dataclass(frozen=True)
class WeightSync:
    """One replica's weight update: the version it now runs and the seconds `pull` took."""

    version: int
    seconds: float


class Generator(Actor):
    """Loads the policy from `model_path` with `from_pretrained` and samples from it."""

    def __init__(
        self, model_path: str, model: ModelConfig, sampling: SamplingConfig, seed: int
    ) -> None:
        torch.set_num_threads(1)  # many small processes share the cores
        dtype = torch.bfloat16 if model.dtype == "bfloat16" else torch.float32
        self._device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self._model = load_policy(model_path, dtype)
        if self._device.type == "cuda":
            self._model.cuda()  # type: ignore[call-arg]
        self._tokenizer = load_tokenizer(model_path)
        self._sampling = sampling
        self._chat = model.chat_template
        self._version = 0
        self._receiver: ReshardReceiver | None = None
        # Replicas get the same arguments; the pid keeps their samples independent.
        self._rng = torch.Generator(self._device).manual_seed(seed * 1_000_003 + os.getpid())

    @endpoint
    async def generate(self, prompts: list[str]) -> list[list[Completion]]:
        """`sampling.group_size` completions per prompt, all from the current version."""
        if self._chat:
            prompts = [
                str(
                    self._tokenizer.apply_chat_template(
                        [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
                    )
                )
                for p in prompts
            ]
        return generate(
            self._model,
            self._tokenizer,
            prompts,
            self._sampling,
            self._version,
            generator=self._rng,
        )

    @endpoint
    async def update_weights(self, update: WeightUpdate) -> WeightSync:
        """Pulls the newest staged version (at least `update.version`), all or nothing."""
        if isinstance(update, ShardedWeights):
            if self._receiver is None:
                self._receiver = ReshardReceiver(dict(self._model.named_parameters()))
            seconds = await self._receiver.pull(update)
            self._version = update.version
            return WeightSync(update.version, seconds)
        result = await pull(update, into=self._model.state_dict(), allow_cast=True)
        self._version = result.version
        return WeightSync(result.version, result.seconds)

    @endpoint
    async def weights(self) -> tuple[int, dict[str, torch.Tensor]]:
        """The version this replica runs and its parameters by name (for checks)."""
        params = {n: p.detach().cpu().clone() for n, p in self._model.named_parameters()}
        return self._version, params
