"""Starting and stopping the job's processes, and the controller's handles on them.

Each component runs in its own process (a service: one process per replica): the dataset,
the replay buffer, the trainer (one process or a sharded mesh), the reference model when
the KL term is on, the generator and reward services, and with `--env.tasks` one service
per environment (`rl_envs`). Each is spawned on the host mesh its placement names
(`launchers.Hosts`; this host unless `--placement` says otherwise).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable

from actor_service import ReplicaEvent, Service, ServiceConfig, spawn_service
from monarch.actor import ProcMesh
from replay_buffer import Episode, ReplayBufferActor, ReplayBufferConfig
from rl_envs import EnvironmentService, spawn_environment
from torch import Tensor

from async_grpo.actors.buffer import BufferActor
from async_grpo.actors.dataset import DatasetActor
from async_grpo.actors.generator import Generator
from async_grpo.actors.reference import ReferenceModel
from async_grpo.actors.reward import RewardActor
from async_grpo.actors.trainer import Trainer, TrainResult
from async_grpo.config import RunConfig
from async_grpo.environments import parse_env_weights
from async_grpo.launchers import Hosts, start_hosts
from async_grpo.prepare import Prepared
from async_grpo.training import add_stats
from async_grpo.weight_sync import WeightUpdate, merge

# How long a call waits for a replica when none is serving: a respawned replica starts a
# process, imports torch and loads the model again (tens of seconds on a loaded 2-core
# machine, minutes for a large model), and the run should wait for it, not fail.
REPLICA_RESTART_WAIT_S = 600.0


class TrainerMesh:
    """The controller's handle on the trainer's ranks (one or more): every call goes to all
    of them, and their answers are merged into the whole batch's."""

    def __init__(self, ranks: Trainer) -> None:
        self.ranks = ranks

    async def publish_initial(self) -> WeightUpdate:
        """Version 0, staged for the generators."""
        return merge(list((await self.ranks.publish_initial.call()).values()))

    async def train_step(self, episodes: list[Episode], ref_logprobs: Tensor | None) -> TrainResult:
        """One optimizer step on the batch; returns once its weights are staged."""
        steps = list((await self.ranks.train_step.call(episodes, ref_logprobs)).values())
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
        await self.ranks.release.call(version)

    async def full_weights(self) -> dict[str, Tensor]:
        """The current parameters, unsharded, by name."""
        return dict(next(iter((await self.ranks.full_weights.call()).values())))


@dataclasses.dataclass
class Components:
    """Handles to every running component, and every process mesh to stop at the end."""

    dataset: DatasetActor
    generator: Service[Generator]
    reward: Service[RewardActor]
    reference: ReferenceModel | None
    buffer: ReplayBufferActor  # the app's `BufferActor`: the same endpoints, traced
    trainer: TrainerMesh
    procs: list[ProcMesh]
    hosts: Hosts
    """The host meshes everything runs on; stopped last."""
    envs: dict[str, EnvironmentService] = dataclasses.field(default_factory=dict)
    """One service per environment of `--env.tasks`, by name (empty without)."""


async def spawn_trainer(
    cfg: RunConfig, model_path: str, procs: list[ProcMesh], hosts: Hosts
) -> TrainerMesh:
    """Spawns the trainer on a mesh of `cfg.trainer.procs` processes spread evenly over the
    hosts of its host mesh (appended to `procs`, so the caller stops it even when set-up
    fails)."""
    per_host = hosts.plan.trainer_per_host(cfg.trainer.procs)
    mesh = hosts.mesh("trainer").spawn_procs(per_host={"procs": per_host})
    procs.append(mesh)
    if cfg.trainer.procs > 1:
        # Imported here: a one-process trainer never pays for torch.distributed's set-up.
        from monarch.spmd import setup_torch_elastic_env_async  # noqa: PLC0415

        await setup_torch_elastic_env_async(mesh)
    args = (model_path, cfg.trainer, cfg.sampling, cfg.seed, cfg.steps)
    return TrainerMesh(mesh.spawn("trainer", Trainer, *args))


async def spawn_components(
    cfg: RunConfig, prep: Prepared, on_replica_event: Callable[[ReplicaEvent], None]
) -> Components:
    """Starts every component; `on_replica_event` hears of every service replica that dies,
    comes back or is given up on."""
    procs: list[ProcMesh] = []
    hosts = start_hosts(prep.placement, cfg.placement, cfg.out_dir)
    timeout = prep.placement.call_timeout_s

    def proc(component: str) -> ProcMesh:
        mesh = hosts.first_host(component).spawn_procs(per_host={"procs": 1})
        procs.append(mesh)
        return mesh

    buffer_cfg = ReplayBufferConfig(
        max_policy_age=cfg.effective_max_policy_age,
        max_buffer_size=cfg.buffer.capacity,
        admission_limit=cfg.buffer.capacity,
        group_size=cfg.sampling.group_size,
        sampling="fifo",
        seed=cfg.seed,
    )
    try:
        dataset = proc("dataset").spawn("dataset", DatasetActor, cfg.data, prep.samples, cfg.seed)
        buffer = proc("buffer").spawn("replay_buffer", BufferActor, buffer_cfg)
        trainer = await spawn_trainer(cfg, prep.model_path, procs, hosts)
        reference = None
        if cfg.trainer.loss.kl_coef > 0:
            reference = proc("reference").spawn(
                "reference", ReferenceModel, prep.model_path, cfg.sampling
            )
        started = await asyncio.gather(
            spawn_service(
                Generator,
                ServiceConfig(
                    replicas=cfg.generator.replicas,
                    name="generator",
                    no_healthy_timeout_s=REPLICA_RESTART_WAIT_S,
                    call_timeout_s=timeout,
                ),
                prep.model_path,
                cfg.model,
                cfg.sampling,
                cfg.seed,
                cfg.generator,
                hosts=hosts.for_service("generator"),
            ),
            spawn_service(
                RewardActor,
                ServiceConfig(
                    replicas=cfg.reward.replicas,
                    name="reward",
                    no_healthy_timeout_s=REPLICA_RESTART_WAIT_S,
                    call_timeout_s=timeout,
                ),
                cfg.reward.fns,
                hosts=hosts.for_service("reward"),
            ),
            return_exceptions=True,
        )
        generator, reward = started
        if isinstance(generator, BaseException) or isinstance(reward, BaseException):
            for svc in started:
                if isinstance(svc, Service):
                    await svc.shutdown()
            raise next(e for e in started if isinstance(e, BaseException))
    except BaseException:
        await _stop(procs)  # the plain meshes started so far
        hosts.stop()
        raise
    for svc in (generator, reward):
        svc.add_listener(on_replica_event)
    c = Components(dataset, generator, reward, reference, buffer, trainer, procs, hosts)
    try:
        c.envs = await spawn_envs(cfg, on_replica_event, hosts)
    except BaseException:
        await shutdown(c)
        raise
    return c


async def spawn_envs(
    cfg: RunConfig, on_replica_event: Callable[[ReplicaEvent], None], hosts: Hosts
) -> dict[str, EnvironmentService]:
    """One service per environment of `--env.tasks` (none without). Its replicas hold many
    episodes each and answer them concurrently (a sandboxed program runs while other
    episodes step)."""
    envs: dict[str, EnvironmentService] = {}
    try:
        for name in parse_env_weights(cfg.env.tasks) if cfg.env.tasks else {}:
            config = ServiceConfig(
                replicas=cfg.env.replicas,
                name=name,
                max_in_flight_per_replica=64,
                no_healthy_timeout_s=REPLICA_RESTART_WAIT_S,
                call_timeout_s=hosts.plan.call_timeout_s,
            )
            envs[name] = await spawn_environment(name, config, hosts=hosts.for_service("env"))
            service = envs[name].service
            assert isinstance(service, Service)  # spawned here, not a handle
            service.add_listener(on_replica_event)
    except BaseException:
        for env in envs.values():
            with contextlib.suppress(Exception):
                await env.shutdown()
        raise
    return envs


async def shutdown(c: Components) -> None:
    """Stops every service and process this run started, then the hosts they ran on."""
    services: list[Service[Generator] | Service[RewardActor] | EnvironmentService] = [
        c.generator,
        c.reward,
        *c.envs.values(),
    ]
    for svc in services:
        with contextlib.suppress(Exception):
            await svc.shutdown()
    await _stop(c.procs)
    c.hosts.stop()


async def _stop(procs: list[ProcMesh]) -> None:
    for mesh in procs:
        with contextlib.suppress(Exception):
            await mesh.stop()
