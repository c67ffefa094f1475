"""Starting and stopping the job's processes, and the controller's handles on them.

Each component runs in its own process, on the host mesh its placement names
(`launchers.Hosts`; this host unless `--placement` says otherwise): the trainer (one process
or a sharded mesh), and as services (`actor-service`: a replica that dies is started again,
the calls it was serving sent again) the dataset, the replay buffer, the reference model
when the KL term is on, the generator and reward services, and with `--env.tasks` one
service per environment (`rl_envs`). A service replica that hangs is found by its call
timeout (`--generator.call_timeout_s`, ...) and replaced the same way. The trainer is the
controller's to restore (`controller/recovery.py`): a call to a dead trainer raises
`launch.trainer.TrainerDied`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from actor_service import ReplicaEvent, Service, ServiceConfig, spawn_service
from monarch.actor import ProcMesh
from replay_buffer import ReplayBufferConfig
from rl_envs import EnvironmentService, make, spawn_environment

from async_grpo.actors.buffer import BufferActor
from async_grpo.actors.cores import ProcessSetup
from async_grpo.actors.crash_stacks import ReportingCrashes
from async_grpo.actors.dataset import DatasetActor
from async_grpo.actors.generator import Generator
from async_grpo.actors.reference import ReferenceModel
from async_grpo.actors.reward import RewardActor
from async_grpo.config.schema import RunConfig
from async_grpo.launch.devices import GpuBlocks
from async_grpo.launch.launchers import Hosts, start_hosts
from async_grpo.launch.prepare import Prepared
from async_grpo.launch.trainer import TrainerMesh, spawn_trainer
from async_grpo.observability.crashes import crash_dir
from async_grpo.tasks.environments import parse_env_weights

# How long a call waits for a replica when none is serving: a respawned replica starts a
# process, imports torch and loads the model again (tens of seconds on a loaded 2-core
# machine, minutes for a large model), and the run should wait for it, not fail.
REPLICA_RESTART_WAIT_S = 600.0


# The buffer's calls wait on purpose (a put for room, the trainer's sample up to the 1 s it
# asks for), so only the trainer's sample is timed: a buffer that leaves it unanswered this
# long is hung.
BUFFER_SAMPLE_TIMEOUT_S = 120.0


# The dataset answers from memory, at once.
DATASET_TIMEOUT_S = 60.0


@dataclasses.dataclass
class Components:
    """Handles to every running component, and every process mesh to stop at the end."""

    dataset: Service[DatasetActor]
    generator: Service[Generator]
    reward: Service[RewardActor]
    reference: Service[ReferenceModel] | None
    buffer: Service[BufferActor]
    trainer: TrainerMesh
    procs: list[ProcMesh]
    hosts: Hosts
    """The host meshes everything runs on; stopped last."""
    envs: dict[str, EnvironmentService] = dataclasses.field(default_factory=dict)
    """One service per environment of `--env.tasks`, by name (empty without)."""

    def services(self) -> dict[str, Service[Any]]:
        """Every service by name, the environments' included."""
        named: dict[str, Service[Any]] = {
            "dataset": self.dataset,
            "generator": self.generator,
            "reward": self.reward,
            "buffer": self.buffer,
        }
        if self.reference is not None:
            named["reference"] = self.reference
        for name, env in self.envs.items():
            assert isinstance(env.service, Service)  # spawned here, not a handle
            named[name] = env.service
        return named


def buffer_config(cfg: RunConfig) -> ReplayBufferConfig:
    """The replay buffer of a run: whole groups, the run's staleness bound, oldest first."""
    return ReplayBufferConfig(
        max_policy_age=cfg.effective_max_policy_age,
        max_buffer_size=cfg.buffer.capacity,
        admission_limit=cfg.buffer.capacity,
        group_size=cfg.sampling.group_size,
        sampling="fifo",
        seed=cfg.seed,
    )


def service_config(
    name: str,
    replicas: int,
    cfg: RunConfig,
    prep: Prepared,
    timeout_s: float = 0.0,
    *,
    gpus: GpuBlocks | None = None,
    **more: Any,
) -> ServiceConfig:
    """A service of the run: waits for a replica being restarted, restarts each replica up
    to `cfg.max_restarts` times, and takes a replica that leaves a call unanswered for
    `timeout_s` (0: never) as hung. Across hosts the placement's call timeout also applies
    (a dead host's replicas never answer): the shorter of the two wins. `gpus`: the GPUs
    its replicas are pinned to (`launch/devices.py`; None: the CPU)."""
    limits = [t for t in (timeout_s or None, prep.placement.call_timeout_s) if t]
    return ServiceConfig(
        replicas=replicas,
        name=name,
        no_healthy_timeout_s=REPLICA_RESTART_WAIT_S,
        max_restarts=cfg.max_restarts,
        call_timeout_s=min(limits) if limits else None,
        spawn_timeout_s=prep.placement.spawn_timeout_s,
        with_gpus=gpus is not None,
        first_gpu=gpus.first if gpus is not None else 0,
        gpus_per_proc=gpus.per_replica if gpus is not None else 1,
        **more,
    )


async def spawn_components(
    cfg: RunConfig,
    prep: Prepared,
    on_replica_event: Callable[[ReplicaEvent], None],
    restore: Path | None = None,
    *,
    log: Callable[[str], None] = print,
) -> Components:
    """Starts the hosts and every component on them (the trainer from `restore`, a trainer
    checkpoint directory, when given); `on_replica_event` hears of every service replica
    that dies, comes back or is given up on."""
    procs: list[ProcMesh] = []
    started: list[Service[Any]] = []
    hosts = start_hosts(prep.placement, cfg.placement, cfg.out_dir)
    crashes = str(crash_dir(cfg.out_dir))
    # The processes the loop waits on least yield their cores (`--nice`).
    helper = ProcessSetup(cfg.nice, crashes)

    async def service(
        component: str, actor: type[Any], config: ServiceConfig, *args: Any, **kwargs: Any
    ) -> Service[Any]:
        where = hosts.for_service(component)
        svc = await spawn_service(actor, config, *args, hosts=where, **kwargs)
        started.append(svc)
        return svc

    try:
        trainer_start = spawn_trainer(cfg, prep, procs, hosts, restore, log=log)
        # Sharing one GPU, the trainer takes its memory before the generator sizes its own.
        early = await trainer_start if prep.devices.colocated else None
        # The rest concurrently: each starts processes that import torch and load a model.
        spawned = await _all(
            trainer_start if early is None else _ready(early),
            service(
                "dataset",
                DatasetActor,
                service_config("dataset", 1, cfg, prep, DATASET_TIMEOUT_S),
                cfg.data,
                prep.samples,
                cfg.seed,
                helper,
            ),
            service(
                "buffer",
                BufferActor,
                # Its endpoints are concurrent: puts waiting for room, the trainer's sample
                # and a checkpoint's state_dict are all in flight at once.
                service_config(
                    "buffer",
                    1,
                    cfg,
                    prep,
                    max_in_flight_per_replica=64,
                    endpoint_timeouts=(("sample_wait", BUFFER_SAMPLE_TIMEOUT_S),),
                ),
                buffer_config(cfg),
                helper,
            ),
            service(
                "generator",
                Generator,
                service_config(
                    "generator",
                    cfg.generator.replicas,
                    cfg,
                    prep,
                    cfg.generator.call_timeout_s,
                    gpus=prep.devices.generator_blocks,
                ),
                prep.model_path,
                cfg.model,
                cfg.sampling,
                cfg.seed,
                cfg.generator,
                device=prep.devices.generator_device,
                lora=cfg.trainer.lora,
                setup=helper,
            ),
            service(
                "reward",
                RewardActor,
                service_config("reward", cfg.reward.replicas, cfg, prep, cfg.reward.call_timeout_s),
                cfg.reward.fns,
                helper,
            ),
            service(
                "reference",
                ReferenceModel,
                service_config(
                    "reference",
                    1,
                    cfg,
                    prep,
                    cfg.generator.call_timeout_s,
                    gpus=prep.devices.reference_blocks,
                ),
                prep.model_path,
                cfg.sampling,
                cfg.model.dtype,
                prep.devices.reference_device,
                cfg.trainer.micro_batch_tokens,
                setup=ProcessSetup(crash_dir=crashes),
            )
            if cfg.trainer.loss.kl_coef > 0
            else _ready(None),
        )
        trainer, dataset, buffer, generator, reward, reference = spawned
    except BaseException:
        for svc in started:
            with contextlib.suppress(Exception):
                await svc.shutdown()
        await _stop(procs)  # the trainer, if it started
        hosts.stop()
        raise
    for svc in started:
        svc.add_listener(on_replica_event)
    c = Components(dataset, generator, reward, reference, buffer, trainer, procs, hosts)
    try:
        c.envs = await spawn_envs(cfg, prep, on_replica_event, hosts)
    except BaseException:
        await shutdown(c)
        raise
    return c


async def spawn_envs(
    cfg: RunConfig,
    prep: Prepared,
    on_replica_event: Callable[[ReplicaEvent], None],
    hosts: Hosts,
) -> dict[str, EnvironmentService]:
    """One service per environment of `--env.tasks` (none without). Its replicas hold many
    episodes each and answer them concurrently (a sandboxed program runs while other
    episodes step)."""
    envs: dict[str, EnvironmentService] = {}
    crashes = str(crash_dir(cfg.out_dir))
    try:
        for name in parse_env_weights(cfg.env.tasks) if cfg.env.tasks else {}:
            config = service_config(
                name,
                cfg.env.replicas,
                cfg,
                prep,
                cfg.env.call_timeout_s,
                max_in_flight_per_replica=64,
            )
            # Its replicas write their crash stacks where the run's other processes do.
            factory = ReportingCrashes(functools.partial(make, name), crashes, name)
            envs[name] = await spawn_environment(factory, config, hosts=hosts.for_service("env"))
            service = envs[name].service
            assert isinstance(service, Service)  # spawned here, not a handle
            service.add_listener(on_replica_event)
    except BaseException:
        for env in envs.values():
            with contextlib.suppress(Exception):
                await env.shutdown()
        raise
    return envs


def process_table(c: Components) -> dict[str, list[int]]:
    """The process ids of every component now, by component (a service: every replica's,
    in replica order; none for a replica that is down)."""
    table = {
        name: [pid for replica in svc.status().replicas for pid in replica.pids]
        for name, svc in c.services().items()
    }
    table["trainer"] = list(c.trainer.pid_list)
    return table


async def shutdown(c: Components) -> None:
    """Stops every service and process this run started, then the hosts they ran on. All
    at once: one by one, a tiny run's took 4.2 s here, each mostly waiting."""
    await asyncio.gather(*(svc.shutdown() for svc in c.services().values()), return_exceptions=True)
    await _stop([*c.procs, c.trainer.mesh])
    c.hosts.stop()


async def _ready(value: Any) -> Any:
    return value


async def _all(*starts: Awaitable[Any]) -> list[Any]:
    """Every start's result, once all have ended; the first failure is raised only then, so
    the caller's clean-up sees every service that did start."""
    results = await asyncio.gather(*starts, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return list(results)


async def _stop(procs: list[ProcMesh]) -> None:
    await asyncio.gather(*(mesh.stop() for mesh in procs), return_exceptions=True)
