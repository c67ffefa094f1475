"""The controller's handle on the trainer, and how the trainer's death reaches the run.

The trainer's processes are spawned by the controller itself (`spawn_trainer`), so Monarch
reports their failure to the controller's `monarch.actor.unhandled_fault_hook`, whose default
exits: the whole run would be lost with one process. `tolerate_trainer_deaths` puts a filter
in front of whatever hook is installed that drops the failures of the trainer's meshes (its
actor, Monarch's per-process log forwarder, the SPMD set-up actor of a sharded trainer) and
passes every other failure on. The death itself reaches the run as `TrainerDied`, raised by
the next call to the trainer (`TrainerMesh`), and the run restores the trainer from its last
checkpoint (`controller.recovery`). (Every other process is a service replica, whose
failures its service's own supervisor handles.)"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import monarch.actor
from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError
from monarch.actor import MeshFailure, ProcMesh, current_rank
from replay_buffer import Episode
from torch import Tensor

from async_grpo.actors.trainer import Trainer, TrainResult
from async_grpo.config.schema import RunConfig
from async_grpo.grpo.step import add_stats
from async_grpo.launch.launchers import Hosts
from async_grpo.launch.prepare import Prepared
from async_grpo.weight_sync.update import WeightUpdate, merge

log = logging.getLogger(__name__)


# Mesh names start with the name given at spawn; Monarch's own actors on every process the
# controller spawns are its log forwarders ("logger") and, sharded, "_SPMDActor".
TRAINER_MESHES = ("trainer", "logger", "_SPMDActor")


_previous: list[Callable[[MeshFailure], None]] = []


class TrainerDied(RuntimeError):
    """A trainer process died (or was found dead); the message is Monarch's reason."""


def _hook(failure: MeshFailure) -> None:
    if failure.mesh_name.startswith(TRAINER_MESHES):
        log.info("a trainer process failed: %s", failure)
        return
    _previous[-1](failure)


def tolerate_trainer_deaths() -> None:
    """Installs the filter (once per process)."""
    if monarch.actor.unhandled_fault_hook is not _hook:
        _previous.append(monarch.actor.unhandled_fault_hook)
        monarch.actor.unhandled_fault_hook = _hook


class TrainerMesh:
    """The controller's handle on the trainer's ranks (one or more): every call goes to all
    of them, and their answers are merged into the whole batch's. A call to a trainer whose
    process died raises `TrainerDied`."""

    def __init__(self, ranks: Trainer, mesh: ProcMesh) -> None:
        self.ranks, self.mesh = ranks, mesh
        self.pid_list: list[int] = []  # every rank's process id, once `pids` answered

    async def _call(self, call: Awaitable[Any]) -> list[Any]:
        try:
            answers = await call
        except SupervisionError as e:
            lines = str(e).strip().splitlines()
            raise TrainerDied(lines[-1].strip() if lines else "a trainer process failed") from e
        return list(answers.values())

    async def publish_initial(self) -> WeightUpdate:
        """The version the trainer starts from, staged for the generators."""
        return merge(await self._call(self.ranks.publish_initial.call()))

    async def train_step(self, episodes: list[Episode], ref_logprobs: Tensor | None) -> TrainResult:
        """One optimizer step on the batch; returns once its weights are staged."""
        steps: list[TrainResult] = await self._call(
            self.ranks.train_step.call(episodes, ref_logprobs)
        )
        return TrainResult(
            version=steps[0].version,
            weights=merge([s.weights for s in steps]),
            stats=add_stats([s.stats for s in steps]),
            grad_norm=steps[0].grad_norm,
            lr=steps[0].lr,
            train_s=max(s.train_s for s in steps),
            publish_s=max(s.publish_s for s in steps),
        )

    async def release(self, version: int) -> None:
        """Every generator runs `version` or newer: older staging may be reused."""
        await self._call(self.ranks.release.call(version))

    async def full_weights(self) -> dict[str, Tensor]:
        """The current parameters, unsharded, by name."""
        return dict((await self._call(self.ranks.full_weights.call()))[0])

    async def save(self, path: Path) -> float:
        """Starts writing the trainer's checkpoint into `path` (every rank its part); returns
        once staged: the seconds training was held (the slowest rank's)."""
        held: list[float] = await self._call(self.ranks.save.call(str(path)))
        return max(held)

    async def saved(self) -> None:
        """Returns once the last `save` is on disk."""
        await self._call(self.ranks.saved.call())

    async def pids(self) -> list[int]:
        """Every rank's process id (a call: it also tells whether the trainer is alive)."""
        self.pid_list = [int(p) for p in await self._call(self.ranks.pid.call())]
        return self.pid_list

    async def stop(self) -> None:
        """Stops the trainer's processes (dead or alive)."""
        with contextlib.suppress(Exception):
            await self.mesh.stop()


async def spawn_trainer(
    cfg: RunConfig,
    prep: Prepared,
    procs: list[ProcMesh],
    hosts: Hosts,
    restore: Path | None = None,
) -> TrainerMesh:
    """Spawns the trainer on a mesh of `cfg.trainer.procs` processes spread evenly over the
    hosts of its host mesh (appended to `procs`, so the caller stops it even when set-up
    fails), each pinned to its GPU by the device map, from `restore` (a trainer checkpoint
    directory) when given."""
    tolerate_trainer_deaths()
    per_host = hosts.plan.trainer_per_host(cfg.trainer.procs)
    first = prep.devices.trainer_first_gpu
    bootstrap = functools.partial(pin_trainer_gpu, first) if first is not None else None
    mesh = hosts.mesh("trainer").spawn_procs(per_host={"procs": per_host}, bootstrap=bootstrap)
    procs.append(mesh)
    if cfg.trainer.procs > 1:
        # Imported here: a one-process trainer never pays for torch.distributed's set-up.
        from monarch.spmd import setup_torch_elastic_env_async  # noqa: PLC0415

        await setup_torch_elastic_env_async(mesh)
    args = (prep.model_path, cfg.trainer, cfg.sampling, cfg.seed, cfg.steps)
    kwargs = {"device": prep.devices.trainer_device}
    if restore is not None:
        kwargs["restore"] = str(restore)
    trainer = TrainerMesh(mesh.spawn("trainer", Trainer, *args, **kwargs), mesh)
    await trainer.pids()
    return trainer


def pin_trainer_gpu(first_gpu: int) -> None:
    """Bootstrap of a trainer process: local rank `r` sees only GPU `first_gpu + r` of those
    its parent saw (an inherited CUDA_VISIBLE_DEVICES is a list to pick from)."""
    index = first_gpu + current_rank()["procs"]
    inherited = os.environ.get("CUDA_VISIBLE_DEVICES")
    if inherited:
        listed = [d.strip() for d in inherited.split(",") if d.strip()]
        os.environ["CUDA_VISIBLE_DEVICES"] = listed[index] if index < len(listed) else "-1"
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(index)
