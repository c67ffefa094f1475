"""The policy a trainer checkpoint holds, as a model you can use: whole, or its LoRA adapter.

A trainer checkpoint (`trainer_state`) holds what was trained and nothing else: every weight
of a full fine-tune, or only the adapters of a LoRA run (the base weights are the model's
as loaded). So the base checkpoint the run started from (`model_path`) is read first, the
trained tensors are put into it, and then:

- `trained_policy`: a plain `transformers` model; a LoRA run's adapters are merged into the
  base weights (W + (alpha / rank) * B A) and peft is gone, so `from_pretrained` of what
  `save_pretrained` writes needs nothing but `transformers`;
- `trained_adapter`: the `PeftModel` of a LoRA run, whose `save_pretrained` writes the
  adapter alone (`adapter_config.json`, `adapter_model.safetensors`: megabytes, where the
  model is gigabytes), loaded back onto the base with `peft.PeftModel.from_pretrained`.

`checkpoint/export.py` writes either one as a directory (`async-grpo export`, with
`--adapter-only` the adapter).

    trained_policy(run / "checkpoints/step-000800/trainer", model_path, cfg.trainer.lora)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel

from async_grpo.checkpoint.trainer_state import load_model_state
from async_grpo.config.schema import LoraConfig
from async_grpo.model.lora import add_adapters
from async_grpo.model.policy import load_policy

if TYPE_CHECKING:
    from peft import PeftModel


def _check(trainer_dir: Path) -> None:
    if not (trainer_dir / ".metadata").is_file():
        raise FileNotFoundError(f"{trainer_dir} is not a trainer checkpoint (no .metadata)")


def trained_adapter(
    trainer_dir: Path, model_path: str, lora: LoraConfig, dtype: torch.dtype = torch.float32
) -> PeftModel:
    """The base model of `model_path` with the LoRA adapters saved in `trainer_dir` (a
    checkpoint's `trainer/` directory, written by a run with `lora`). Raises `ValueError`
    for a run without adapters."""
    if not lora.enabled:
        raise ValueError(
            "this run trained every weight (trainer.lora.rank 0): it has no adapter to "
            "export alone; export the whole model"
        )
    _check(trainer_dir)
    base = load_policy(model_path, dtype)
    adapter = add_adapters(base, lora)
    load_model_state(base, trainer_dir)
    return adapter


def trained_policy(
    trainer_dir: Path, model_path: str, lora: LoraConfig, dtype: torch.dtype = torch.float32
) -> PreTrainedModel:
    """The policy saved in `trainer_dir` as one plain `transformers` model: the checkpoint's
    weights, or for a LoRA run the base of `model_path` with the adapters merged in."""
    if lora.enabled:
        merged: PreTrainedModel = trained_adapter(
            trainer_dir, model_path, lora, dtype
        ).merge_and_unload()
        return merged
    _check(trainer_dir)
    model = load_policy(model_path, dtype)
    load_model_state(model, trainer_dir)
    return model
