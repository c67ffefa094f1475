"""The trainer's part of a checkpoint: its weights, AdamW state and version, written as a
distributed checkpoint (`torch.distributed.checkpoint`, DCP).

DCP stores every tensor by name and by the slices each rank held, so a checkpoint written
by N sharded ranks loads into M (or into one unsharded process, and back): a run may resume
with another `--trainer.procs`. `torch.distributed.checkpoint.state_dict.get_state_dict`
names the optimizer state by parameter name, the same for a plain and an FSDP model. The
learning-rate schedule is a function of the version (`grpo.step.learning_rate`), so the
version is its whole state. Only what trains is saved: with LoRA adapters
(`trainer.lora.rank > 0`) that is the adapters and their AdamW moments (the base weights
are the model's as loaded, again on restore), so a checkpoint is megabytes, not the model.

Copying and writing happen in the background (`CheckpointWriter`): the trainer is held only
while it hands DCP its state, and its next optimizer update waits for the copy to finish. A
sharded trainer's ranks agree on the write plan over a process group of their own (gloo),
so the background collectives never interleave with the training step's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse, async_save

from async_grpo.grpo.step import TrainerCore

# DCP warns on every call made without a process group (also from its writer thread); one
# process is meant so.
warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)


# Frozen weights are not the run's state: with LoRA adapters the base weights are the
# model's as loaded, and the checkpoint holds the adapters and their AdamW moments alone
# (without adapters nothing is frozen, and it holds every weight).
# Not strict when setting: the frozen weights are absent on purpose, and DCP's load has
# already refused a checkpoint that lacks any of the trained ones.
OPTIONS = StateDictOptions(ignore_frozen_params=True, strict=False)


def _trained_only(model: torch.nn.Module, state: dict[str, Any]) -> dict[str, Any]:
    """`state` without the entries that are a frozen weight under another name: a tied head
    is not a parameter of its own, so `ignore_frozen_params` keeps it (545 MB of
    Qwen2.5-0.5B's embedding in every LoRA checkpoint)."""
    frozen = {p.data_ptr() for p in model.parameters() if not p.requires_grad}
    if not frozen:
        return state
    return {k: v for k, v in state.items() if v.data_ptr() not in frozen}


def _state(core: TrainerCore) -> dict[str, Any]:
    """What a checkpoint holds, as DCP reads and writes it: the tensors are the model's and
    optimizer's own (a load fills them in place)."""
    model, optim = get_state_dict(core.model, core.optimizer, options=OPTIONS)
    model = _trained_only(core.model, model)
    return {"model": model, "optim": optim, "trainer": {"version": core.version}}


def load_model_state(model: torch.nn.Module, path: Path) -> None:
    """Fills `model`'s trained weights (every one not frozen) from the trainer checkpoint in
    `path`, in one process, leaving the optimizer's state on disk (an export)."""
    state = {"model": _trained_only(model, get_model_state_dict(model, options=OPTIONS))}
    dcp_load(state, checkpoint_id=str(path), no_dist=True)
    set_model_state_dict(model, state["model"], options=OPTIONS)


def load_trainer_state(core: TrainerCore, path: Path, sharded: bool) -> None:
    """Replaces `core`'s weights, optimizer state and version with those saved in `path`
    (written by any number of ranks)."""
    state = _state(core)
    dcp_load(state, checkpoint_id=str(path), no_dist=not sharded)
    set_state_dict(
        core.model,
        core.optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
        options=OPTIONS,
    )
    core.version = int(state["trainer"]["version"])


class CheckpointWriter:
    """Writes a trainer rank's state in the background, one checkpoint at a time.

    `start` hands DCP the state; a thread copies it to CPU memory (pinned, on its own CUDA
    stream, when the weights are on a GPU) while the trainer goes on, and then writes it.
    Only the weights' next change has to wait for the copy: `staged` blocks until it is
    done, and `TrainerCore` calls it right before its optimizer updates the weights, so the
    copy overlaps the forward and backward pass of the next step (`gpu`: the weights are on a
    GPU, so the copy is pinned and asynchronous). Every rank of a sharded
    trainer makes one, at the same point (the constructor creates the ranks' checkpoint
    process group, a collective)."""

    def __init__(self, sharded: bool, *, gpu: bool = False) -> None:
        self._sharded = sharded
        self._gpu = gpu
        group = dist.new_group(backend="gloo") if sharded else None
        self._group = group if isinstance(group, dist.ProcessGroup) else None
        self._stager: DefaultStager | None = None
        self._staging: concurrent.futures.Future[Any] | None = None
        self._pending: concurrent.futures.Future[Any] | None = None

    @property
    def writing(self) -> bool:
        """A copy or a write is running in the background."""
        return self._pending is not None and not self._pending.done()

    def start(self, core: TrainerCore, path: Path) -> float:
        """Starts copying `core`'s state and writing it to `path`; returns the seconds the
        trainer was held (waiting for the previous write, if checkpoints come faster than
        they are written, and handing the state over)."""
        begin = time.perf_counter()
        if self._pending is not None:
            self._pending.result()  # one write at a time; raises if the last one failed
        # A stager per checkpoint: torch 2.11's empties its copy table once it has staged
        # (its `_stage` calls `close`), so a second checkpoint through the same one fails
        # with "KeyError: <class 'type'>" (seen on the GPU machine, docs/gpu_check.md).
        # Newer versions could reuse the pinned copy; a fresh stager allocates it again.
        if self._stager is not None:
            self._stager.close()
        self._stager = DefaultStager(
            StagingOptions(
                use_pinned_memory=self._gpu,
                use_shared_memory=False,
                use_async_staging=True,
                use_non_blocking_copy=self._gpu,
            )
        )
        path.mkdir(parents=True, exist_ok=True)
        saved = async_save(
            _state(core),
            checkpoint_id=str(path),
            process_group=self._group,
            no_dist=not self._sharded,
            async_stager=self._stager,
        )
        if not isinstance(saved, AsyncSaveResponse):
            raise TypeError(f"dcp.async_save returned {type(saved).__name__}")
        self._staging, self._pending = saved.staging_completion, saved.upload_completion
        return time.perf_counter() - begin

    def staged(self) -> None:
        """Returns once the last checkpoint's copy of the state is complete: the weights may
        change from then on (raises what the copy raised)."""
        if self._staging is not None:
            self._staging.result()

    async def wait(self) -> None:
        """Returns once the last write is on disk (raises what it raised)."""
        if self._pending is not None:
            await asyncio.wrap_future(self._pending)
