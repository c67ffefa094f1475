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

import asyncio
import contextlib
import functools
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from actor_service import FaultFilter
from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError
from monarch.actor import MeshFailure, ProcMesh, current_rank
from replay_buffer import Episode
from torch import Tensor

from async_grpo.actors.cores import ProcessSetup
from async_grpo.actors.trainer import Trainer, TrainResult
from async_grpo.config.schema import RunConfig, TrainerConfig
from async_grpo.grpo.step import add_stats
from async_grpo.launch.launchers import Hosts
from async_grpo.launch.prepare import Prepared
from async_grpo.observability.crashes import crash_dir, crash_note, read_crashes
from async_grpo.observability.stuck import STUCK_DIR, record_stuck, stuck_line, where_stuck
from async_grpo.weight_sync.update import WeightUpdate, merge

log = logging.getLogger(__name__)


# The names the trainer's meshes are spawned with: Monarch's own actors on every process the
# controller spawns are its log forwarders ("logger") and, sharded, "_SPMDActor".
TRAINER_MESHES = ("trainer", "logger", "_SPMDActor")


# A train step's deadline, when `trainer.step_timeout_s` is 0: the slowest step so far times
# this, never below the floor; the first step also builds kernels and caches.
STEP_DEADLINE_FACTOR = 10.0
MIN_STEP_DEADLINE_S = 120.0
FIRST_STEP_DEADLINE_S = 600.0
STOP_DEADLINE_S = 60.0


class TrainerDied(RuntimeError):
    """A trainer process died (or was found dead); the message is Monarch's reason."""


def mesh_name_prefix(name: str) -> str:
    """A mesh name in lower case, letters and digits only: the name a mesh was spawned with
    ("_SPMDActor") and the one Monarch reports in its failure ("spmdactor-3fKx..." in
    Monarch 0.7) then share a prefix."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


_TRAINER_PREFIXES = tuple(mesh_name_prefix(m) for m in TRAINER_MESHES)


def _trainer_mesh(failure: MeshFailure) -> bool:
    # Compared as Monarch spells them: a sharded rank's death was reported as the failure of
    # "spmdactor-...", which a match on "_SPMDActor" let through to the hook that ends the
    # controller, instead of a restore.
    return mesh_name_prefix(failure.mesh_name).startswith(_TRAINER_PREFIXES)


_trainer_deaths = FaultFilter("a trainer process failed", _trainer_mesh)


def tolerate_trainer_deaths() -> None:
    """Puts the filter in front of the installed hook (again, if another went in front)."""
    _trainer_deaths.install()


class TrainerMesh:
    """The controller's handle on the trainer's ranks (one or more): every call goes to all
    of them, and their answers are merged into the whole batch's. A call to a trainer whose
    process died raises `TrainerDied` (with where a rank that crashed was, from the stacks it
    wrote into `<out_dir>/crashes/`); so does one it leaves unanswered past its deadline
    (`trainer.step_timeout_s`, `trainer.call_timeout_s`), after the stuck processes' stacks
    are saved into `<out_dir>/stuck/` and named in one line to `log`."""

    def __init__(
        self,
        ranks: Trainer,
        mesh: ProcMesh,
        cfg: TrainerConfig,
        out_dir: Path,
        log: Callable[[str], None] = print,
    ) -> None:
        self.ranks, self.mesh = ranks, mesh
        self._cfg, self._out_dir, self._log = cfg, out_dir, log
        self.pid_list: list[int] = []  # every rank's process id, once `pids` answered
        self._slowest_step: float | None = None

    def step_deadline(self) -> float:
        """Seconds a train step may take: `trainer.step_timeout_s`, or from the steps so far
        (a first step also builds kernels and caches, so it gets more)."""
        if self._cfg.step_timeout_s > 0:
            return self._cfg.step_timeout_s
        if self._slowest_step is None:
            return FIRST_STEP_DEADLINE_S
        return max(MIN_STEP_DEADLINE_S, STEP_DEADLINE_FACTOR * self._slowest_step)

    async def _call(self, name: str, call: Awaitable[Any], deadline: float) -> list[Any]:
        try:
            answers = await asyncio.wait_for(call, deadline)
        except SupervisionError as e:
            lines = str(e).strip().splitlines()
            reason = lines[-1].strip() if lines else "a trainer process failed"
            # Monarch names only the signal: where a rank was is in the stacks it wrote.
            crashed = read_crashes(self._out_dir, self.pid_list)
            raise TrainerDied(reason + crash_note(crashed)) from e
        except TimeoutError:
            # Alive but not answering: where it is stuck goes with the run before the
            # process is replaced (restored from the newest checkpoint, as after a death).
            stuck = await asyncio.to_thread(record_stuck, self._out_dir, "trainer", self.pid_list)
            self._log(stuck_line("trainer", name, deadline, stuck))
            where = f" ({where_stuck(stuck)})" if stuck else ""
            raise TrainerDied(
                f"no answer to `{name}` within {deadline:g} s{where}; stack in "
                f"{self._out_dir / STUCK_DIR}"
            ) from None
        return list(answers.values())

    async def publish_initial(self) -> WeightUpdate:
        """The version the trainer starts from, staged for the generators."""
        call = self.ranks.publish_initial.call()
        return merge(await self._call("publish_initial", call, self._cfg.call_timeout_s))

    async def train_step(
        self, episodes: Sequence[Episode], ref_logprobs: Tensor | None
    ) -> TrainResult:
        """One optimizer step on the batch; returns once its weights are staged."""
        return await self.finish_step(self.start_step(episodes, ref_logprobs))

    def start_step(
        self, episodes: Sequence[Episode], ref_logprobs: Tensor | None
    ) -> asyncio.Future[Any]:
        """Sends one optimizer step on the batch now; the trainer runs it after the steps
        sent before it. `finish_step` waits for its answer."""
        return asyncio.ensure_future(self.ranks.train_step.call(episodes, ref_logprobs))

    async def finish_step(self, sent: asyncio.Future[Any]) -> TrainResult:
        """The answer to a step `start_step` sent, once its weights are staged. Its deadline
        counts from this call: call it when the steps sent before it have answered."""
        start = time.perf_counter()
        steps: list[TrainResult] = await self._call("train_step", sent, self.step_deadline())
        took = time.perf_counter() - start
        self._slowest_step = max(self._slowest_step or 0.0, took)
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
        """Every generator runs `version` or newer: older staging may be reused. Only a
        sharded trainer's staging waits for this word (`dtensor_reshard.ShardedPublisher`);
        a one-process trainer's needs none (`rdma_tensor.Publisher.release`), so it is not
        sent a message that would change nothing."""
        if not self._cfg.sharded:
            return
        await self._call("release", self.ranks.release.call(version), self._cfg.call_timeout_s)

    async def full_weights(self) -> dict[str, Tensor]:
        """The current parameters, unsharded, by name."""
        call = self.ranks.full_weights.call()
        return dict((await self._call("full_weights", call, self._cfg.call_timeout_s))[0])

    async def save(self, path: Path) -> float:
        """Starts writing the trainer's checkpoint into `path` (every rank its part); returns
        once staged: the seconds training was held (the slowest rank's)."""
        call = self.ranks.save.call(str(path))
        held: list[float] = await self._call("save", call, self._cfg.call_timeout_s)
        return max(held)

    async def saved(self) -> None:
        """Returns once the last `save` is on disk."""
        await self._call("saved", self.ranks.saved.call(), self._cfg.call_timeout_s)

    async def pids(self) -> list[int]:
        """Every rank's process id (a call: it also tells whether the trainer is alive)."""
        answers = await self._call("pid", self.ranks.pid.call(), self._cfg.call_timeout_s)
        self.pid_list = [int(p) for p in answers]
        return self.pid_list

    async def stop(self) -> None:
        """Stops the trainer's processes (dead, alive or stuck); gives up waiting after
        `STOP_DEADLINE_S` (a host that is gone never answers)."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.mesh.stop(), STOP_DEADLINE_S)


async def spawn_trainer(
    cfg: RunConfig,
    prep: Prepared,
    procs: list[ProcMesh],
    hosts: Hosts,
    restore: Path | None = None,
    *,
    log: Callable[[str], None] = print,
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
    if cfg.trainer.sharded:
        # Imported here: a one-process trainer never pays for torch.distributed's set-up.
        from monarch.spmd import setup_torch_elastic_env_async  # noqa: PLC0415

        await setup_torch_elastic_env_async(mesh)
    args = (prep.model_path, cfg.trainer, cfg.sampling, cfg.seed, cfg.steps)
    kwargs: dict[str, Any] = {
        "device": prep.devices.trainer_device,
        "setup": ProcessSetup(crash_dir=str(crash_dir(cfg.out_dir))),
    }
    if restore is not None:
        kwargs["restore"] = str(restore)
    ranks = mesh.spawn("trainer", Trainer, *args, **kwargs)
    trainer = TrainerMesh(ranks, mesh, cfg.trainer, Path(cfg.out_dir), log)
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
