"""The `vllm` engine: a vLLM `LLM` inside the generator replica's own process.

Generation: every prompt is templated and tokenized here, by the app's tokenizer, exactly
as the `hf` engine does, and handed to vLLM as token ids (vLLM loads no tokenizer). The
sampling parameters are the configured distribution and nothing else (`generation_config=
"vllm"`: a checkpoint's own defaults, such as a top-k or a repetition penalty, are ignored);
a model whose vocabulary is padded past the tokenizer is limited to the tokenizer's tokens,
as `grpo.logprobs.masked_logits` does. vLLM runs with `logprobs_mode="processed_logprobs"`, so
the log-prob it returns for each sampled token is that of the distribution it sampled from,
after temperature and top-p: the behavior log-prob the trainer's recomputation reproduces.

Weights: a version is staged on CPU in the trainer's names (`weight_sync.staging`: mapped, not
copied, on the trainer's machine) and loaded in place by the model runner's
`reload_weights(..., is_checkpoint_format=True)` (vLLM's layer-wise reload: each layer's
weights are loaded and re-processed for its kernels, then copied into the running storage).
The prefix cache is reset after every load: a cached prefix holds keys and values the old
weights computed. No checkpoint file, no restart.

LoRA adapters (`lora.rank > 0`) are merged here, not served by vLLM's own LoRA support: a
version arrives as the adapter's tensors alone (the bytes a sync moves stay the adapter's),
then W + (alpha / rank) * B A is computed on CPU from the checkpoint's weights, kept here
from start-up (`model.lora.merged_weights`), and the merged state dict goes through the
same in-place reload as a whole-model version. vLLM's LoRA path would load each version
from an adapter directory on disk under a new adapter id (one file write and one load per
version, an id per version to retire) and run the extra LoRA kernels at every token; merged
weights sample at the base model's speed, and the reload is the one the whole-model path
already tests. What merging costs: the reload of every linear layer per version, as for a
whole-model sync, and a CPU copy of the base weights per replica.

Processes: `VLLM_ENABLE_V1_MULTIPROCESSING=0` keeps vLLM's engine core in this process, so
with one worker (tensor parallel 1) vLLM starts no process at all, and a replica that dies
leaves nothing behind. With tensor parallel > 1 (CUDA) vLLM starts one worker process per
extra GPU; they watch their parent and exit with it.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import Tensor

from async_grpo.config.schema import LoraConfig, ModelConfig, SamplingConfig
from async_grpo.generation.decoding import Completion, chat_prompt
from async_grpo.model.lora import merged_weights
from async_grpo.model.policy import load_tokenizer
from async_grpo.seeds import derive_seed
from async_grpo.weight_sync.staging import Stager
from async_grpo.weight_sync.update import WeightSync, WeightUpdate

INSTALL_HINT = (
    "install it with `uv sync --extra vllm` (vLLM's CPU build) or `uv sync --extra vllm-cuda` "
    "(its CUDA build), then start the job with `uv run --extra vllm ...` (or `--extra "
    "vllm-cuda`) so that `uv run` keeps it"
)


class EngineError(RuntimeError):
    """The vLLM engine cannot start with this model or this configuration."""


def installed() -> bool:
    """Whether a vLLM build can be imported here (checked without importing it)."""
    return importlib.util.find_spec("vllm") is not None


def _architectures(model_path: str) -> list[str]:
    """The `architectures` of a local checkpoint's config.json ([] when not readable here)."""
    config = Path(model_path) / "config.json"
    if not config.is_file():
        return []
    archs = json.loads(config.read_text()).get("architectures") or []
    return [str(a) for a in archs]


def _with_seed(params: Any, seed: int) -> Any:
    """A copy of vLLM `SamplingParams` with its own seed."""
    seeded = params.clone()
    seeded.seed = seed
    return seeded


def _reload(worker: Any, weights: Mapping[str, Tensor]) -> None:
    """Runs in each vLLM worker: loads a checkpoint-format state dict in place.

    A tensor whose name is a parameter of the running model outside its linear layers (the
    embedding, an untied head, the norms) goes straight through that parameter's own loader,
    as at start-up. Everything else (linear layers: fused, sharded, repacked for their
    kernels) goes through vLLM's layer-wise reload. On Qwen2.5-0.5B the embedding is a
    quarter of the bytes, and the direct path skips the reload's extra copies for it.
    """
    linear = importlib.import_module("vllm.model_executor.layers.linear").LinearBase
    model = worker.model_runner.get_model()
    hf_config = worker.model_runner.model_config.hf_config
    if getattr(hf_config, "tie_word_embeddings", False) and "lm_head.weight" not in weights:
        # A sharded trainer publishes parameters, where a tied head is the embedding alone;
        # vLLM's reload then leaves its head module on stale values (measured: log-probs
        # 1.7e-3 off after one step; test_sharded_trainer_weights_reach_the_vllm_engine).
        embedding = weights.get("model.embed_tokens.weight")
        if embedding is not None:
            weights = {**weights, "lm_head.weight": embedding}
    params = dict(model.named_parameters())
    layered: dict[str, Tensor] = {}
    with torch.no_grad():
        for name, tensor in weights.items():
            param = params.get(name)
            owner = model.get_submodule(name.rpartition(".")[0]) if param is not None else None
            if param is None or isinstance(owner, linear):
                layered[name] = tensor
                continue
            loader = getattr(param, "weight_loader", None)
            if loader is None:
                param.data.copy_(tensor)
            else:
                loader(param, tensor)
    worker.model_runner.reload_weights(
        weights_iterator=iter(layered.items()), is_checkpoint_format=True
    )


def checkpoint_weights(model_path: str) -> dict[str, Tensor]:
    """Every tensor of the safetensors checkpoint in `model_path`, by name, on CPU."""
    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        raise EngineError(f"{model_path} holds no *.safetensors weights to merge adapters into")
    weights: dict[str, Tensor] = {}
    for file in files:
        weights.update(load_file(str(file)))
    return weights


class VLLMEngine:
    """A vLLM engine on the checkpoint in `model_path`, sampling as `sampling` says.

    kv_cache_gib: memory reserved for the KV cache, in GiB (CPU RAM on a CPU, GPU memory on
        a GPU). tensor_parallel: GPUs the model is split over (1 on a CPU). kv_block_tokens:
        tokens per KV-cache block (0: vLLM's choice, 128 on a CPU). lora: the trainer's LoRA
        adapters, merged into the weights at every version.
    Raises `EngineError` naming the problem when vLLM is missing or cannot load the model.
    """

    def __init__(
        self,
        model_path: str,
        model: ModelConfig,
        sampling: SamplingConfig,
        seed: int,
        *,
        kv_cache_gib: float,
        tensor_parallel: int = 1,
        kv_block_tokens: int = 0,
        lora: LoraConfig | None = None,
    ) -> None:
        if not installed():
            raise EngineError(f"generator.engine vllm: vLLM is not installed; {INSTALL_HINT}")
        # Read when vLLM's modules are first imported, so set before that.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        vllm = importlib.import_module("vllm")
        registry = importlib.import_module("vllm.model_executor.models.registry")
        platforms = importlib.import_module("vllm.platforms")
        supported = set(registry.ModelRegistry.get_supported_archs())
        unknown = [a for a in _architectures(model_path) if a not in supported]
        if unknown:
            raise EngineError(
                f"generator.engine vllm: vLLM {vllm.__version__} cannot load {model_path}: "
                f"architecture {', '.join(unknown)} is not one it supports; use "
                "--generator.engine hf for this model"
            )
        self._tokenizer = load_tokenizer(model_path)
        eos = self._tokenizer.eos_token_id
        if eos is None:
            raise EngineError(f"the tokenizer of {model_path} has no EOS token")
        self._eos = int(eos)
        self._sampling = sampling
        self._chat = model.chat_template
        on_cpu = bool(platforms.current_platform.is_cpu())
        try:
            self._llm = vllm.LLM(
                model=model_path,
                dtype=model.dtype,
                skip_tokenizer_init=True,
                generation_config="vllm",
                logprobs_mode="processed_logprobs",
                kv_cache_memory_bytes=int(kv_cache_gib * 2**30),
                tensor_parallel_size=tensor_parallel,
                # torch.compile on a CPU costs minutes of start-up for little gain here.
                enforce_eager=on_cpu,
                enable_prefix_caching=True,
                block_size=kv_block_tokens or None,
                # Replicas get the same arguments; the pid keeps their samples independent.
                seed=(seed * 1_000_003 + os.getpid()) % 2**31,
            )
        except (ValueError, RuntimeError) as e:
            raise EngineError(f"generator.engine vllm: vLLM could not start: {e}") from e
        vocab = int(self._llm.llm_engine.model_config.get_vocab_size())
        # A vocabulary padded past the tokenizer (a random-weights model with a small
        # tokenizer): sample only real tokens, as `grpo.logprobs.masked_logits` does.
        allowed = list(range(len(self._tokenizer))) if vocab > len(self._tokenizer) else None
        params = functools.partial(
            vllm.SamplingParams,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_new_tokens,
            logprobs=0,  # the sampled token's only
            stop_token_ids=[self._eos],
            allowed_token_ids=allowed,
            detokenize=False,
        )
        self._params = params(n=sampling.group_size)
        self._turn_params = params(n=1)  # a multi-turn episode samples each turn once
        self._stager = Stager()
        self._lora = lora if lora is not None and lora.enabled else None
        # The base weights the adapters are merged into, as the checkpoint holds them.
        self._base = checkpoint_weights(model_path) if self._lora is not None else {}
        self.version = 0
        self.last_reload_s = 0.0

    def generate(self, prompts: list[str], seed: int | None = None) -> list[list[Completion]]:
        """`group_size` completions per prompt, in prompt order, all from `self.version`."""
        tok = self._tokenizer
        texts = [chat_prompt(tok, p) for p in prompts] if self._chat else prompts
        ids = [list(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
        return self._sample(ids, prompts, self._params, seed)

    def continue_turns(
        self, contexts: list[list[int]], seed: int | None = None
    ) -> list[Completion]:
        """One completion per context of token ids, in order, all from `self.version`."""
        groups = self._sample(contexts, [""] * len(contexts), self._turn_params, seed)
        return [group[0] for group in groups]

    def _sample(
        self, ids: list[list[int]], labels: list[str], params: Any, seed: int | None
    ) -> list[list[Completion]]:
        version = self.version
        requests = [{"prompt_token_ids": i} for i in ids]
        if seed is not None:
            # vLLM seeds per request: each prompt's own, derived from the call's.
            params = [_with_seed(params, derive_seed(seed, k) % 2**31) for k in range(len(ids))]
        outputs = self._llm.generate(requests, params, use_tqdm=False)
        groups: list[list[Completion]] = []
        for label, prompt_ids, out in zip(labels, ids, outputs, strict=True):
            group = []
            for sample in out.outputs:
                response = [int(t) for t in sample.token_ids]
                steps = zip(sample.logprobs, response, strict=True)
                logprobs = [float(step[token].logprob) for step, token in steps]
                finished = bool(response) and response[-1] == self._eos
                group.append(
                    Completion(
                        prompt=label,
                        text=str(self._tokenizer.decode(response[:-1] if finished else response)),
                        prompt_ids=prompt_ids,
                        response_ids=response,
                        behavior_logprobs=logprobs,
                        finished=finished,
                        policy_version=version,
                    )
                )
            groups.append(group)
        return groups

    async def load_weights(self, update: WeightUpdate) -> WeightSync:
        """Loads `update` (or a newer staged version) in place; returns once it runs.

        Generation and loading never overlap: both are synchronous calls on this process's
        one engine, and the version changes in the same step as the weights.
        """
        staged = await self._stager.pull(update)
        start = time.perf_counter()
        if staged.version != self.version:
            weights = staged.tensors
            if self._lora is not None:
                weights = merged_weights(self._base, staged.tensors, self._lora)
            self._llm.collective_rpc(_reload, args=(weights,))
            if not self._llm.reset_prefix_cache():
                raise RuntimeError("vLLM refused to reset its prefix cache after a weight load")
            self.version = staged.version
        self.last_reload_s = time.perf_counter() - start
        return WeightSync(self.version, staged.seconds + self.last_reload_s, staged.transport)

    def close(self) -> None:
        """Stops vLLM's engine (and its worker processes, if it started any)."""
        core = getattr(self._llm.llm_engine, "engine_core", None)
        if core is not None:
            core.shutdown()
