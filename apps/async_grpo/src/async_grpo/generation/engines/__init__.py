"""Generation engines: what a generator replica samples with and loads new weights into.

Two engines behind one small interface (`Engine`), picked by `--generator.engine`:

- `hf` (default): a `transformers` model and the app's own sampling loop
  (`decoding.generate`); nothing to install, right on a CPU;
- `vllm`: a vLLM engine inside the replica's process (`engines.vllm_engine`), with weights
  loaded in place from `rdma-tensor` or `dtensor-reshard`. Needs `uv sync --extra vllm`
  (CPU build) or `--extra vllm-cuda` (CUDA build).

Both sample exactly the configured distribution and record the log-probs of what they
sampled, so the trainer's recomputation agrees with either.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Protocol, get_args

from async_grpo.config.schema import LoraConfig, ModelConfig, SamplingConfig
from async_grpo.generation.decoding import Completion
from async_grpo.weight_sync.update import WeightSync, WeightUpdate

EngineName = Literal["hf", "vllm"]
ENGINES: tuple[str, ...] = get_args(EngineName)


class Engine(Protocol):
    """One replica's policy: samples completions and takes new weights, one at a time."""

    version: int
    """The weight version every completion it returns now is stamped with (0: the checkpoint)."""

    def generate(self, prompts: list[str], seed: int | None = None) -> list[list[Completion]]:
        """`sampling.group_size` completions per prompt, in prompt order, all sampled from
        weights `version`. With `seed` the samples are a function of (prompts, weights,
        seed) alone, whatever this replica sampled before; without, of its own stream."""
        ...

    def continue_turns(
        self, contexts: list[list[int]], seed: int | None = None
    ) -> list[Completion]:
        """One completion per context of token ids (a multi-turn conversation so far), in
        order, all sampled from weights `version` (`seed` as for `generate`)."""
        ...

    async def load_weights(self, update: WeightUpdate) -> WeightSync:
        """Installs `update` (or a newer staged version), all or nothing; `version` changes
        only once the new weights are in."""
        ...

    def close(self) -> None:
        """Releases what the engine holds beyond this process's memory."""
        ...


def make_engine(
    name: str,
    model_path: str,
    model: ModelConfig,
    sampling: SamplingConfig,
    seed: int,
    *,
    kv_cache_gib: float = 1.0,
    tensor_parallel: int = 1,
    kv_block_tokens: int = 0,
    device: str = "auto",
    lora: LoraConfig | None = None,
) -> Engine:
    """Starts engine `name` on the checkpoint in `model_path` (in this process), on `device`
    (hf; vLLM runs where its build does, on the GPUs this process sees), serving the
    trainer's LoRA adapters when `lora` is enabled."""
    if name == "hf":
        from async_grpo.generation.engines.hf import HFEngine  # noqa: PLC0415

        return HFEngine(model_path, model, sampling, seed, device, lora=lora)
    if name == "vllm":
        # Imported here: the hf engine never pays for (or needs) vLLM.
        from async_grpo.generation.engines.vllm_engine import VLLMEngine  # noqa: PLC0415

        return VLLMEngine(
            model_path,
            model,
            sampling,
            seed,
            kv_cache_gib=kv_cache_gib,
            tensor_parallel=tensor_parallel,
            kv_block_tokens=kv_block_tokens,
            lora=lora,
        )
    raise ValueError(f"unknown generation engine {name!r}; known: {', '.join(ENGINES)}")


def available_memory_gib() -> float:
    """Memory the kernel says new allocations can have now (MemAvailable), in GiB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    raise RuntimeError("/proc/meminfo has no MemAvailable line")


def check_engine(name: str, *, replicas: int, kv_cache_gib: float, on_gpu: bool) -> str | None:
    """What stops engine `name` from starting here, as one message, or None.

    Cheap checks for the controller, before any process is spawned: an unknown engine,
    vLLM not installed (the message says how to install it), and on a CPU a KV-cache
    reservation for all `replicas` larger than the memory available. What needs vLLM itself
    (whether it can load the model's architecture) is checked as each replica starts.
    """
    if name not in ENGINES:
        return f"unknown engine {name!r}; known: {', '.join(ENGINES)}"
    if name == "hf":
        return None
    from async_grpo.generation.engines.vllm_engine import INSTALL_HINT, installed  # noqa: PLC0415

    if not installed():
        return f"vLLM is not installed; {INSTALL_HINT}"
    if not on_gpu:
        need, have = kv_cache_gib * replicas, available_memory_gib()
        if need > have:
            return (
                f"the KV cache of {replicas} replica(s) x {kv_cache_gib:g} GiB = {need:g} GiB "
                f"does not fit in the {have:.1f} GiB of memory available; lower "
                "--generator.kv_cache_gib or --generator.replicas"
            )
    return None
