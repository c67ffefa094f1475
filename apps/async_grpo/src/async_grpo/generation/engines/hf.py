"""The `hf` engine: the policy as a `transformers` model, sampled by `decoding.generate`.

The embedded default: nothing to install beyond the app, the same model class the trainer
runs, and weights pulled straight into its parameters. Right for a CPU and for checking;
on a GPU an inference engine (`engines.vllm`) keeps the device far busier.

With LoRA (`lora.rank > 0`) the model carries the trainer's adapters (`model.lora`, the same
peft wrapping, so the same names) and samples from base + adapter; a pull copies the adapter
tensors alone into them, all or nothing, the base weights never change.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor
from transformers import PreTrainedModel

from async_grpo.config.schema import LoraConfig, ModelConfig, SamplingConfig
from async_grpo.generation.decoding import Completion, generate, sample
from async_grpo.model.lora import adapter_state, add_adapters
from async_grpo.model.policy import load_policy, load_tokenizer, torch_device, torch_dtype
from async_grpo.weight_sync.update import WeightSync, WeightUpdate, pull


class HFEngine:
    """Loads the policy from `model_path` with `from_pretrained` onto `device` ("auto": CUDA
    when this process sees a GPU). `policy`: a model already loaded (a checkpoint's weights,
    `async-grpo eval`) to use instead, with the tokenizer of `model_path`. `greedy`: every
    token the most likely one (`decoding.sample`), never in training."""

    def __init__(
        self,
        model_path: str,
        model: ModelConfig,
        sampling: SamplingConfig,
        seed: int,
        device: str = "auto",
        *,
        policy: PreTrainedModel | None = None,
        greedy: bool = False,
        lora: LoraConfig | None = None,
    ) -> None:
        device_ = torch_device(device)
        dtype = torch_dtype(model.dtype)
        # A checkpoint's policy comes in the trainer's float32; it samples in the generators'
        # dtype, as the run's own evaluation does.
        loaded = load_policy(model_path, dtype) if policy is None else policy.to(dtype)  # type: ignore[arg-type]
        wrapped = add_adapters(loaded, lora) if lora is not None and lora.enabled else None
        self._model = loaded.to(device_)  # type: ignore[arg-type]
        # Taken after the move: `to` gives the parameters new storage on a GPU.
        self._adapter = adapter_state(wrapped) if wrapped is not None else None
        self._greedy = greedy
        self._tokenizer = load_tokenizer(model_path)
        self._sampling = sampling
        self._chat = model.chat_template
        self.version = 0
        # Replicas get the same arguments; the pid keeps their samples independent.
        self._rng = torch.Generator(device_).manual_seed(seed * 1_000_003 + os.getpid())

    def generate(self, prompts: list[str], seed: int | None = None) -> list[list[Completion]]:
        return generate(
            self._model,
            self._tokenizer,
            prompts,
            self._sampling,
            self.version,
            chat_template=self._chat,
            generator=self._generator(seed),
            greedy=self._greedy,
        )

    def continue_turns(
        self, contexts: list[list[int]], seed: int | None = None
    ) -> list[Completion]:
        return sample(
            self._model,
            self._tokenizer,
            contexts,
            self._sampling,
            self.version,
            generator=self._generator(seed),
            greedy=self._greedy,
        )

    def _generator(self, seed: int | None) -> torch.Generator:
        """The request's own stream when it brings a seed (seeding costs ~1 us), else this
        replica's."""
        if seed is None:
            return self._rng
        return torch.Generator(self._rng.device).manual_seed(seed)

    async def load_weights(self, update: WeightUpdate) -> WeightSync:
        result = await pull(update, self._model, self._adapter)
        self.version = result.version
        return result

    def weights(self) -> dict[str, Tensor]:
        """The parameters by name, copied to CPU."""
        return {n: p.detach().cpu().clone() for n, p in self._model.named_parameters()}

    def close(self) -> None:
        """Nothing to stop: the model lives in this process's memory."""
