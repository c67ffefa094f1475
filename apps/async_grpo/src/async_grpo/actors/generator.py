"""The generator actor (one replica of the generator service): samples and takes new weights.

The actor only holds an engine (`generation.engines`: `hf` or `vllm`) and serves it. A
plain Monarch endpoint runs one message at a time, and both engines generate and load
weights synchronously, so `update_weights` never lands in the middle of a `generate`: each
batch runs on exactly one policy version, the one stamped on its completions.

A request may bring the weights it needs (`weights`: the newest version the controller
knows): a replica behind them pulls them first, so a replica restarted after a death never
serves its checkpoint's weights. A request may bring a `seed`: its samples then depend on
(prompts, weights, seed) only, not on what this replica served before, which is what makes
a sync run repeat exactly (`docs/09_fault_tolerance.md`).
"""

from __future__ import annotations

import torch
from monarch.actor import Actor, endpoint

from async_grpo import tracing
from async_grpo.actors._test_hang import maybe_hang
from async_grpo.actors.cores import ProcessSetup, settle_heap, share_cores
from async_grpo.config.schema import GeneratorConfig, LoraConfig, ModelConfig, SamplingConfig
from async_grpo.generation.decoding import Completion
from async_grpo.generation.engines import make_engine
from async_grpo.generation.engines.hf import HFEngine
from async_grpo.weight_sync.update import WeightSync, WeightUpdate


class Generator(Actor):
    """Starts `generator.engine` on the checkpoint in `model_path` and samples from it, on
    `device` (`launch/devices.py` pinned this process to its GPUs), with the trainer's LoRA
    adapters when `lora` is enabled."""

    def __init__(
        self,
        model_path: str,
        model: ModelConfig,
        sampling: SamplingConfig,
        seed: int,
        generator: GeneratorConfig | None = None,
        *,
        device: str = "auto",
        lora: LoraConfig | None = None,
        setup: ProcessSetup | None = None,
    ) -> None:
        share_cores(setup, "generator")
        gen = generator if generator is not None else GeneratorConfig()
        tracing.start_from_env("generator")
        self._engine = make_engine(
            gen.engine,
            model_path,
            model,
            sampling,
            seed,
            kv_cache_gib=gen.kv_cache_gib,
            tensor_parallel=gen.tensor_parallel,
            kv_block_tokens=gen.kv_block_tokens,
            device=device,
            lora=lora,
        )
        self._last_pull: WeightSync | None = None
        settle_heap()

    @endpoint
    async def generate(
        self, prompts: list[str], seed: int | None = None, weights: WeightUpdate | None = None
    ) -> list[list[Completion]]:
        """`sampling.group_size` completions per prompt, all from one version: `weights` or
        newer (pulled first if this replica is behind), or the current one without."""
        maybe_hang("generator", "generate")
        await self._at_least(weights)
        with tracing.span("generate", prompts=len(prompts), version=self._engine.version) as s:
            groups = self._engine.generate(prompts, seed)
            s.set(tokens=sum(len(c.response_ids) for g in groups for c in g))
        return groups

    @endpoint
    async def continue_turns(
        self,
        contexts: list[list[int]],
        seed: int | None = None,
        weights: WeightUpdate | None = None,
    ) -> list[Completion]:
        """One completion per multi-turn context (token ids), from one version (as `generate`)."""
        await self._at_least(weights)
        with tracing.span("generate", prompts=len(contexts), version=self._engine.version) as s:
            completions = self._engine.continue_turns(contexts, seed)
            s.set(tokens=sum(len(c.response_ids) for c in completions))
        return completions

    @endpoint
    async def update_weights(self, update: WeightUpdate, exact: bool = False) -> WeightSync:
        """Pulls `update` (or a newer staged version), all or nothing; a version this replica
        already runs (or an older one) is skipped, unless `exact`: after the trainer was
        restored from a checkpoint, its version replaces a newer one that no longer exists.
        A skipped update answers with the pull that brought the running version (a generation
        request usually brings it first), so the broadcast still learns what it cost."""
        if not exact and update.version <= self._engine.version:
            last = self._last_pull
            if last is not None and last.version == self._engine.version:
                return last
            return WeightSync(self._engine.version, 0.0)
        return await self._pull(update)

    async def _at_least(self, weights: WeightUpdate | None) -> None:
        if weights is not None and weights.version > self._engine.version:
            await self._pull(weights)

    async def _pull(self, update: WeightUpdate) -> WeightSync:
        with tracing.span("update_weights", version=update.version, bytes=update.nbytes) as s:
            synced = await self._engine.load_weights(update)
            s.set(got=synced.version)
        self._last_pull = synced
        return synced

    @endpoint
    async def version(self) -> int:
        """The weight version this replica samples from."""
        return self._engine.version

    @endpoint
    async def weights(self) -> tuple[int, dict[str, torch.Tensor]]:
        """The version this replica runs and its parameters by name (for checks; the `hf`
        engine only: an inference engine keeps its weights fused and repacked)."""
        if not isinstance(self._engine, HFEngine):
            raise TypeError("weights(): only the hf engine exposes its parameters by name")
        return self._engine.version, self._engine.weights()
