"""From a run to a model you can use: the policy of a checkpoint, loaded in one process
(`load_checkpoint`) or written as a Hugging Face model directory (`export`, the command
`async-grpo export`, `cli/export.py`).

A checkpoint (`disk.py`) holds the trainer's weights as a distributed checkpoint (DCP) in the
trainer's parameter names, split over however many ranks wrote it, but not the model's
architecture or tokenizer: those are the run's base model, the `model.path` its config names
(a directory or a cached hub id, `model/locate.py`) or the random checkpoint the run built in
its output directory (`model.policy.built_checkpoint`). The policy at the checkpoint's
version is that base model with the checkpoint's weights loaded the way the trainer loads
them (`trained_model.trained_policy`), whatever number of ranks wrote them.

An export is written with `save_pretrained` (safetensors weights in float32, the trainer's
dtype; the base model's config) beside its tokenizer, a generation config holding the run's
sampling distribution and `async_grpo.json` (which checkpoint and version, and the run's
config, so `async-grpo eval` of the export defaults to the run's task and settings). It is
written into a hidden directory beside `out` and renamed at the end: `out` is whole or not
there.

A LoRA run's checkpoint holds the adapters alone (`trained_model.py`): its export is the
base model with the adapters merged in, a plain `transformers` model, or with
`adapter_only` the adapter alone (`adapter_config.json`, `adapter_model.safetensors`),
which `peft.PeftModel.from_pretrained` puts back onto the base model.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from torch.distributed.checkpoint.api import CheckpointException
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from async_grpo.checkpoint import disk
from async_grpo.checkpoint.resume import config_from, saved_config
from async_grpo.checkpoint.trained_model import trained_adapter, trained_policy
from async_grpo.config.schema import RunConfig, SamplingConfig
from async_grpo.model.locate import ModelNotFound, locate_model
from async_grpo.model.policy import built_checkpoint, load_policy, load_tokenizer

if TYPE_CHECKING:
    from peft import PeftModel

EXPORT_FILE = "async_grpo.json"
"""What an export records of where it came from: `ExportInfo` as JSON."""


class ExportError(ValueError):
    """What to export, or where to, is not usable; nothing was written."""


@dataclasses.dataclass(frozen=True)
class Policy:
    """A checkpoint's policy in this process: `model` (float32, on the CPU, eval mode) at
    weight `version`, `base` the directory of the base model (its tokenizer, its
    architecture), `config` the run's config, `checkpoint` the directory it came from.
    `adapter`: a LoRA run's adapter as peft holds it, when loaded to be written alone
    (`model` then carries the adapters unmerged); None otherwise (a LoRA run's `model` has
    them merged in)."""

    model: PreTrainedModel
    base: str
    config: RunConfig
    version: int
    checkpoint: Path
    adapter: PeftModel | None = None


@dataclasses.dataclass(frozen=True)
class ExportInfo:
    """`async_grpo.json` of an export: the checkpoint it was written from, its weight
    version and the run's config; `adapter_only` when it holds a LoRA adapter alone."""

    checkpoint: str
    version: int
    config: RunConfig
    adapter_only: bool = False


def is_run_output(path: Path) -> bool:
    """`path` is something of a run's: a checkpoint (complete or not), a run directory, or
    a run's `checkpoints` directory, as opposed to a model directory."""
    return (
        (path / disk.MANIFEST).exists()
        or disk.version_of(path) is not None
        or path.name.startswith(".step-")
        or disk.checkpoints_dir(path).is_dir()
        or path.name == disk.checkpoints_dir(Path()).name
    )


def find_checkpoint(target: Path) -> Path:
    """The checkpoint `target` names, checked whole (`disk.verify`): `target` itself, or the
    newest complete checkpoint of a run directory (or of its `checkpoints` directory)."""
    if not target.exists():
        raise ExportError(f"{target} does not exist")
    if not target.is_dir():
        raise ExportError(f"{target} is a file, not a run directory or a checkpoint")
    if (target / disk.MANIFEST).exists() or disk.version_of(target) is not None:
        path = target
    elif target.name.startswith(".step-"):
        path = target  # a write that was interrupted: `verify` says so
    else:
        run = target.parent if target.name == disk.checkpoints_dir(Path()).name else target
        found = disk.complete(run)
        if not found:
            if disk.checkpoints_dir(run).is_dir():
                raise ExportError(
                    f"{disk.checkpoints_dir(run)} holds no complete checkpoint (a run writes one "
                    "every --checkpoint.every steps, at its end and on Ctrl-C)"
                )
            raise ExportError(f"{target} is not a run directory or a checkpoint ({_what(run)})")
        path = found[-1]
    disk.verify(path)
    return path


def _what(path: Path) -> str:
    """What a directory that holds no checkpoint is, for the error."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        config = None
    if isinstance(config, dict) and "trainer" in config:
        return "a run's output directory that holds no checkpoint yet"
    if isinstance(config, dict):
        return "a model directory already: `async-grpo eval` and transformers read it as it is"
    return f"no {disk.MANIFEST}, no {disk.checkpoints_dir(Path()).name}/ directory"


def base_model(checkpoint: Path, cfg: RunConfig) -> str:
    """The directory of the model the run trained: its `model.path`, or the random checkpoint
    it built, looked for in the run directory holding `checkpoint`, then in the `out_dir` its
    config names."""
    m = cfg.model
    if m.random_weights or not m.path:
        run = checkpoint.parent.parent
        tried = [built_checkpoint(d, m.arch, m.init_seed) for d in (run, Path(cfg.out_dir))]
        for path in tried:
            if (path / "config.json").is_file():
                return str(path)
        raise ExportError(
            f"the run's base model is missing: it built {tried[0].name} into its output "
            f"directory, and neither {tried[0]} nor {tried[1]} holds it"
        )
    try:
        return locate_model(m.path)
    except ModelNotFound as e:
        raise ExportError(f"the run's base model (model.path {m.path!r}): {e}") from None


def load_checkpoint(checkpoint: Path, *, adapter_only: bool = False) -> Policy:
    """The policy of `checkpoint` (checked by `find_checkpoint`) in this process; with
    `adapter_only`, a LoRA run's adapter unmerged (`ExportError` for a run without one)."""
    cfg = saved_config(checkpoint)
    lora = cfg.trainer.lora
    if adapter_only and not lora.enabled:
        raise ExportError(
            f"{checkpoint} is of a run that trained every weight (trainer.lora.rank 0): it "
            "has no adapter to export alone; leave out --adapter-only"
        )
    base = base_model(checkpoint, cfg)
    trainer_dir = checkpoint / disk.TRAINER_DIR
    adapter = None
    try:
        if adapter_only:
            adapter = trained_adapter(trainer_dir, base, lora)
            model = cast(PreTrainedModel, adapter.get_base_model())
        else:
            model = trained_policy(trainer_dir, base, lora)
    except CheckpointException as e:  # a shape or name that does not fit, per rank
        why = next((str(f[0]) for f in e.failures.values()), str(e)).strip().splitlines()
        wrapped = " with the run's LoRA adapters" if lora.enabled else ""
        raise ExportError(
            f"the weights in {checkpoint} do not fit the base model {base}{wrapped}: "
            f"{why[0] if why else 'DCP refused them'}"
        ) from None
    model.train(False)
    version = disk.read_manifest(checkpoint).version
    return Policy(model, base, cfg, version, checkpoint, adapter)


def load_adapter_export(path: Path) -> PreTrainedModel:
    """The model of an adapter-only export `path`: its base model (`adapter_config.json`'s
    `base_model_name_or_path`) with the adapter merged in."""
    from peft import PeftModel  # noqa: PLC0415  (a run without adapters never needs peft)

    try:
        base = json.loads((path / "adapter_config.json").read_text())["base_model_name_or_path"]
    except (OSError, ValueError, KeyError) as e:
        raise ExportError(f"{path} holds no readable LoRA adapter config ({e})") from None
    if not base or not Path(base, "config.json").is_file():
        raise ExportError(
            f"the base model of the adapter {path} ({base!r}, adapter_config.json's "
            "base_model_name_or_path) is not a model directory here"
        )
    adapted = PeftModel.from_pretrained(load_policy(base, torch.float32), str(path))
    merged = cast(PreTrainedModel, adapted.merge_and_unload())
    merged.train(False)
    return merged


def read_export_info(path: Path) -> ExportInfo | None:
    """`async_grpo.json` of an export in `path`; None when there is none (a model directory
    from elsewhere)."""
    file = path / EXPORT_FILE
    if not file.is_file():
        return None
    try:
        raw = json.loads(file.read_text())
        config = config_from(raw["config"], f"{file}'s config")
        adapter_only = bool(raw.get("adapter_only", False))
        return ExportInfo(str(raw["checkpoint"]), int(raw["version"]), config, adapter_only)
    except (ValueError, KeyError, TypeError) as e:  # CheckpointError is a ValueError
        raise ExportError(f"{file} is not an export's record ({e})") from None


def check_destination(out: Path, checkpoint: Path, base: str, force: bool) -> None:
    """`out` may receive an export: it is not there, or an empty directory, or (`force`) a
    directory to replace that holds neither the checkpoint nor the base model, and it is
    not inside the checkpoint."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ExportError(f"{out} exists and is not empty; give --force to replace it")
    where, source = out.resolve(), checkpoint.resolve()
    if where == source or where.is_relative_to(source):
        raise ExportError(f"{out} is inside the checkpoint {checkpoint}")
    for kept, what in ((source, "the checkpoint"), (Path(base).resolve(), "the base model")):
        if kept.is_relative_to(where):
            raise ExportError(f"{out} holds {what} ({kept}); give another directory")
    parent = next((p for p in where.parents if p.exists()), Path("/"))
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ExportError(f"cannot write {out}: {parent} is not a writable directory")


def generation_config(
    sampling: SamplingConfig, tokenizer: PreTrainedTokenizerBase
) -> GenerationConfig:
    """The run's sampling distribution as `generate` (and vLLM) read it: softmax(logits /
    temperature) cut to the top-p nucleus, no top-k, at most `max_new_tokens`, stopping at
    the tokenizer's EOS."""
    return GenerationConfig(  # type: ignore[no-untyped-call]
        do_sample=True,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=0,
        max_new_tokens=sampling.max_new_tokens,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def write_model(policy: Policy, out: Path) -> Path:
    """Writes `policy` as a model directory `out` (checked by `check_destination`; one that
    exists is replaced), or its `adapter` alone when it has one."""
    tokenizer = load_tokenizer(policy.base)
    generation = generation_config(policy.config.sampling, tokenizer)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.parent / f".{out.name}.partial-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        partial.mkdir()
        if policy.adapter is not None:
            # The base as a path that still leads to it from wherever the adapter is loaded.
            config = policy.adapter.peft_config["default"]
            config.base_model_name_or_path = str(Path(policy.base).resolve())
            policy.adapter.save_pretrained(str(partial))
            generation.save_pretrained(str(partial))
        else:
            policy.model.generation_config = generation
            policy.model.save_pretrained(str(partial))
        tokenizer.save_pretrained(str(partial))
        info = {
            "checkpoint": str(policy.checkpoint.resolve()),
            "version": policy.version,
            "adapter_only": policy.adapter is not None,
            "config": dataclasses.asdict(policy.config),
        }
        record = partial / EXPORT_FILE
        record.write_text(json.dumps(info, indent=1, default=str) + "\n")
        # save_pretrained writes the weights owner-only (a temporary file renamed); an export
        # is for others to load, so every file gets the mode the umask gives a new file.
        for file in partial.iterdir():
            file.chmod(record.stat().st_mode & 0o777)
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.urandom(4).hex()}"
            out.rename(old)
            shutil.rmtree(old, ignore_errors=True)
        partial.rename(out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return out


def export(target: Path, out: Path, *, force: bool = False, adapter_only: bool = False) -> Policy:
    """Exports the checkpoint `target` names (a checkpoint, or a run directory's newest) as a
    Hugging Face model directory `out` (`adapter_only`: a LoRA run's adapter alone); returns
    the policy written. Everything is checked, and the weights loaded, before anything is
    written."""
    checkpoint = find_checkpoint(target)
    base = base_model(checkpoint, saved_config(checkpoint))
    check_destination(out, checkpoint, base, force)
    policy = load_checkpoint(checkpoint, adapter_only=adapter_only)
    write_model(policy, out)
    return policy
