"""LoRA adapters on the policy, with `peft`: the same wrapping in the trainer, in every
generator and in an export, so the adapter's tensors have the same names everywhere.

`add_adapters` injects the adapters into the model in place (the model object stays the
`transformers` one, so the train step and the sampling loop run it unchanged: its targeted
layers now compute base + (alpha / rank) * B A) and freezes every base weight. What moves
between processes and what an adapter file holds is `adapter_state`: peft's names
(`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`, the adapter's own name
left out), holding the adapter parameters themselves, so a copy into them is a copy into the
running model.

`peft` is imported where it is used: every process imports the config, and a run without
adapters never needs it.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

if TYPE_CHECKING:
    from peft import PeftModel


class LoraSettings(Protocol):
    """What an adapter is made of (`config.schema.LoraConfig` is one)."""

    @property
    def rank(self) -> int: ...

    @property
    def alpha(self) -> int: ...

    @property
    def dropout(self) -> float: ...

    @property
    def target_modules(self) -> str: ...


def targets(settings: LoraSettings) -> list[str]:
    """The target module names of `settings`, in order, blanks dropped."""
    return [t.strip() for t in settings.target_modules.split(",") if t.strip()]


def _matches(module: str, target: str) -> bool:
    # peft's rule for a list of names: the whole name, or a dotted suffix of it.
    return module == target or module.endswith("." + target)


def linear_module_names(config: PretrainedConfig) -> list[str]:
    """The names of every `nn.Linear` of the causal LM `config` describes, built on the meta
    device (no memory, no weights read)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]


def check_targets(config: PretrainedConfig, settings: LoraSettings) -> None:
    """Raises `ValueError` (one line) when a target names no linear layer of the model
    `config` describes, or when there is no target; checked before anything is spawned."""
    wanted = targets(settings)
    if not wanted:
        raise ValueError("trainer.lora.target_modules is empty; name at least one module")
    names = linear_module_names(config)
    unknown = [t for t in wanted if not any(_matches(n, t) for n in names)]
    if unknown:
        known = sorted({n.rsplit(".", 1)[-1] for n in names})
        raise ValueError(
            f"trainer.lora.target_modules: {', '.join(unknown)} "
            f"{'is not a linear module' if len(unknown) == 1 else 'are not linear modules'} "
            f"of this {config.model_type} model; its linear modules: {', '.join(known)}"
        )


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    # peft asks transformers a deprecated question while it wraps (a FutureWarning per
    # process and call, about a name it uses, not about ours).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated")
        yield


def add_adapters(model: PreTrainedModel, settings: LoraSettings) -> PeftModel:
    """Injects LoRA adapters into `model` in place and freezes its base weights; returns the
    `PeftModel` around it (`model` itself keeps running base + adapter). The adapters start
    as peft makes them: A random (seeded by torch's generator), B zero, so the wrapped model
    computes exactly what `model` did."""
    import peft  # noqa: PLC0415

    config = peft.LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=targets(settings),
        bias="none",
        task_type="CAUSAL_LM",
    )
    with _quiet():
        wrapped = peft.get_peft_model(model, config)
    if wrapped.get_base_model() is not model:
        raise RuntimeError("peft wrapped a copy of the model, not the model itself")
    return wrapped


def adapter_state(wrapped: PeftModel) -> dict[str, Tensor]:
    """The adapter's tensors by peft's names (as an adapter file holds them); each is the
    running parameter itself (detached), so writing into it changes the model."""
    from peft import get_peft_model_state_dict  # noqa: PLC0415

    state: dict[str, Tensor] = get_peft_model_state_dict(wrapped, save_embedding_layers=False)
    params = {p.data_ptr() for p in wrapped.parameters()}
    copied = [n for n, t in state.items() if t.data_ptr() not in params]
    if copied:
        # A copy would publish stale values and swallow every pull: refuse it loudly.
        raise RuntimeError(f"peft returned copies, not the adapter's parameters: {copied[:3]}")
    return state


def train_adapter_dropout(model: torch.nn.Module) -> None:
    """Turns on the adapters' own dropout (and nothing else's) in a model otherwise in eval
    mode: the trainer runs without dropout so its log-probs match the generators'."""
    for name, module in model.named_modules():
        if name.endswith("lora_dropout") or ".lora_dropout." in name:
            module.train(True)


_PEFT_PREFIX = "base_model.model."


def merged_weights(
    base: Mapping[str, Tensor], adapter: Mapping[str, Tensor], settings: LoraSettings
) -> dict[str, Tensor]:
    """`base` (a checkpoint's state dict, its names) with `adapter` (`adapter_state`'s names)
    merged in: W + (alpha / rank) * B A for every adapted layer, computed in float32 and
    cast to W's dtype; every other tensor is `base`'s own. What peft's `merge_and_unload`
    computes, for an engine that loads whole weights (vLLM)."""
    pairs: dict[str, dict[str, Tensor]] = {}
    for name, tensor in adapter.items():
        module, _, kind = name.removeprefix(_PEFT_PREFIX).rpartition(".lora_")
        if kind not in ("A.weight", "B.weight") or f"{module}.weight" not in base:
            raise ValueError(f"adapter tensor {name!r} adapts no weight of the base model")
        pairs.setdefault(module, {})[kind[0]] = tensor
    scale = settings.alpha / settings.rank
    merged = dict(base)
    for module, ab in pairs.items():
        if ab.keys() != {"A", "B"}:
            raise ValueError(f"the adapter of {module!r} lacks its A or B matrix")
        weight = base[f"{module}.weight"]
        delta = ab["B"].float() @ ab["A"].float()
        merged[f"{module}.weight"] = (weight.float() + scale * delta).to(weight.dtype)
    return merged
