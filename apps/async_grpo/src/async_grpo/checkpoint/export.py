"""From a run to a model you can use: the policy of a checkpoint, loaded in one process
(`load_checkpoint`) or written as a Hugging Face model directory (`export`, the command
`async-grpo export`, `cli/export.py`).

A checkpoint (`disk.py`) holds the trainer's weights as a distributed checkpoint (DCP) in the
trainer's parameter names, split over however many ranks wrote it, but not the model's
architecture or tokenizer: those are the run's base model, the `model.path` its config names
(a directory or a cached hub id, `model/locate.py`) or the random checkpoint the run built in
its output directory (`model.policy.built_checkpoint`). The policy at the checkpoint's
version is that base model with the checkpoint's weights loaded the way the trainer loads
them (`load_weights`), whatever number of ranks wrote them.

An export is written with `save_pretrained` (safetensors weights in float32, the trainer's
dtype; the base model's config) beside its tokenizer, a generation config holding the run's
sampling distribution and `async_grpo.json` (which checkpoint and version, and the run's
config, so `async-grpo eval` of the export defaults to the run's task and settings). It is
written into a hidden directory beside `out` and renamed at the end: `out` is whole or not
there.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from async_grpo.checkpoint import disk
from async_grpo.checkpoint.resume import config_from, saved_config
from async_grpo.config.schema import RunConfig, SamplingConfig
from async_grpo.model.locate import ModelNotFound, locate_model
from async_grpo.model.policy import built_checkpoint, load_policy, load_tokenizer

EXPORT_FILE = "async_grpo.json"
"""What an export records of where it came from: `ExportInfo` as JSON."""


class ExportError(ValueError):
    """What to export, or where to, is not usable; nothing was written."""


@dataclasses.dataclass(frozen=True)
class Policy:
    """A checkpoint's policy in this process: `model` (float32, on the CPU, eval mode) at
    weight `version`, `base` the directory of the base model (its tokenizer, its
    architecture), `config` the run's config, `checkpoint` the directory it came from."""

    model: PreTrainedModel
    base: str
    config: RunConfig
    version: int
    checkpoint: Path


@dataclasses.dataclass(frozen=True)
class ExportInfo:
    """`async_grpo.json` of an export: the checkpoint it was written from, its weight
    version and the run's config."""

    checkpoint: str
    version: int
    config: RunConfig


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


def load_weights(model: torch.nn.Module, trainer_dir: Path) -> None:
    """Replaces `model`'s weights (one unsharded process) with those of the trainer's
    distributed checkpoint `trainer_dir`, written by any number of ranks: the model's part
    of what `trainer_state.load_trainer_state` loads, the optimizer's state left on disk."""
    state = {"model": get_model_state_dict(model)}
    dcp_load(state, checkpoint_id=str(trainer_dir), no_dist=True)
    set_model_state_dict(model, state["model"])


def load_checkpoint(checkpoint: Path) -> Policy:
    """The policy of `checkpoint` (checked by `find_checkpoint`) in this process."""
    cfg = saved_config(checkpoint)
    base = base_model(checkpoint, cfg)
    model = load_policy(base, torch.float32)
    try:
        load_weights(model, checkpoint / disk.TRAINER_DIR)
    except CheckpointException as e:  # a shape or name that does not fit, per rank
        why = next((str(f[0]) for f in e.failures.values()), str(e)).strip().splitlines()
        raise ExportError(
            f"the weights in {checkpoint} do not fit the base model {base}: "
            f"{why[0] if why else 'DCP refused them'}"
        ) from None
    return Policy(model, base, cfg, disk.read_manifest(checkpoint).version, checkpoint)


def read_export_info(path: Path) -> ExportInfo | None:
    """`async_grpo.json` of an export in `path`; None when there is none (a model directory
    from elsewhere)."""
    file = path / EXPORT_FILE
    if not file.is_file():
        return None
    try:
        raw = json.loads(file.read_text())
        config = config_from(raw["config"], f"{file}'s config")
        return ExportInfo(str(raw["checkpoint"]), int(raw["version"]), config)
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
    exists is replaced)."""
    tokenizer = load_tokenizer(policy.base)
    policy.model.generation_config = generation_config(policy.config.sampling, tokenizer)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.parent / f".{out.name}.partial-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        partial.mkdir()
        policy.model.save_pretrained(str(partial))
        tokenizer.save_pretrained(str(partial))
        info = {
            "checkpoint": str(policy.checkpoint.resolve()),
            "version": policy.version,
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


def export(target: Path, out: Path, *, force: bool = False) -> Policy:
    """Exports the checkpoint `target` names (a checkpoint, or a run directory's newest) as a
    Hugging Face model directory `out`; returns the policy written. Everything is checked,
    and the weights loaded, before anything is written."""
    checkpoint = find_checkpoint(target)
    base = base_model(checkpoint, saved_config(checkpoint))
    check_destination(out, checkpoint, base, force)
    policy = load_checkpoint(checkpoint)
    write_model(policy, out)
    return policy
