"""Which GPUs each process of a run uses: the device map, decided before anything starts.

Pure: it reads the placement (which host each component's processes are on) and the GPUs of
each machine, and returns where everything goes, or a `DeviceError` naming the numbers that
do not fit. The rules, per machine:

- the trainer's ranks take one GPU each, from GPU 0 on (`trainer.procs` over its hosts);
- each generator replica takes `generator.tensor_parallel` GPUs of its own, after the
  trainer's, and never one another replica has;
- the reference model (the KL term) shares the GPU of the trainer's first rank;
- everything else (dataset, reward, buffer, environments) runs on the CPU;
- one GPU and one trainer rank and one generator replica (tensor parallel 1): the two share
  it (colocated). Their memory shares are then the generator's model and, with vLLM, its
  `--generator.kv_cache_gib` reservation; the trainer has the rest.

A machine is this host for launcher `local`, each host for `slurm` and `kubernetes` (with
`placement.slurm.gpus_per_node` / `placement.kubernetes.gpus_per_pod` GPUs). Launcher
`process` starts several hosts on this one machine and does not divide its GPUs among them:
every component of such a run is on the CPU. `--device cpu` puts everything on the CPU on any
machine; `--device cuda` refuses a machine without GPUs.

Processes get their GPUs through CUDA_VISIBLE_DEVICES, set before they start (a generator or
reference replica by `actor-service`'s `with_gpus`, a trainer rank by `trainer_gpus`); each
then uses `cuda:0` (and a tensor-parallel engine its first `tensor_parallel` devices).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Literal

from async_grpo.launch.placement import PlacementPlan

Device = Literal["auto", "cuda", "cpu"]


class DeviceError(ValueError):
    """The run's processes do not fit the GPUs of the machines they are placed on."""


@dataclasses.dataclass(frozen=True)
class GpuBlocks:
    """How a service's replicas are pinned on every host it runs on: replica block `b` (the
    `b`-th replica on that host) sees GPUs `first + b * per_replica` to `first + (b + 1) *
    per_replica - 1`."""

    first: int
    per_replica: int


@dataclasses.dataclass(frozen=True)
class DeviceMap:
    """Where each process of a run computes. `gpus`: GPUs per machine, as counted;
    `trainer`: per rank, its machine and GPU (None: the CPU); `generator`: per replica, its
    machine and GPUs (empty: the CPU); `reference`: its machine and GPU, None without a
    reference model or on the CPU; `generator_blocks` / `reference_blocks`: the pinning the
    services start their replicas with (None: the CPU); `colocated`: the trainer and the
    generator share one GPU; `kv_cache_gib`: the generator's KV-cache reservation on a GPU
    (vLLM), None when it reserves none."""

    gpus: Mapping[str, int]
    trainer: tuple[tuple[str, int | None], ...]
    generator: tuple[tuple[str, tuple[int, ...]], ...]
    reference: tuple[str, int] | None
    generator_blocks: GpuBlocks | None
    reference_blocks: GpuBlocks | None
    colocated: bool = False
    kv_cache_gib: float | None = None

    @property
    def on_gpu(self) -> bool:
        return any(gpu is not None for _, gpu in self.trainer)

    @property
    def trainer_device(self) -> str:
        return "cuda" if self.on_gpu else "cpu"

    @property
    def generator_device(self) -> str:
        return "cuda" if self.generator_blocks is not None else "cpu"

    @property
    def reference_device(self) -> str:
        return "cuda" if self.reference_blocks is not None else "cpu"

    @property
    def trainer_first_gpu(self) -> int | None:
        """The GPU the trainer's rank 0 on each host takes (rank r: this + r); None: CPU."""
        return 0 if self.on_gpu else None

    def describe(self) -> list[str]:
        """The start line's device map: one line, then one per machine with GPUs."""
        if not self.on_gpu:
            return ["devices: every process on the CPU"]
        lines = ["devices: " + ", ".join(f"{m} {n} GPU(s)" for m, n in self.gpus.items() if n)]
        by_gpu: dict[tuple[str, int], list[str]] = {}
        for rank, (machine, gpu) in enumerate(self.trainer):
            assert gpu is not None
            by_gpu.setdefault((machine, gpu), []).append(f"trainer rank {rank}")
        for replica, (machine, gpus) in enumerate(self.generator):
            for gpu in gpus:
                by_gpu.setdefault((machine, gpu), []).append(f"generator replica {replica}")
        if self.reference is not None:
            by_gpu.setdefault(self.reference, []).append("reference")
        for (machine, gpu), names in sorted(by_gpu.items()):
            lines.append(f"    {machine} GPU {gpu}: {', '.join(names)}")
        if self.colocated:
            kv = (
                f"the model and its {self.kv_cache_gib:g} GiB KV cache"
                if self.kv_cache_gib is not None
                else "the model and its sampling's activations (no KV-cache reservation)"
            )
            lines.append(f"    colocated: the generator holds {kv}; the trainer the rest")
        return lines


def machines(plan: PlacementPlan) -> dict[tuple[str, int], str]:
    """The machine of every host of `plan` (mesh, index), as a label."""
    hosts = [(m, i) for m, n in plan.meshes.items() for i in range(n)]
    if plan.launcher in ("local", "process"):
        return dict.fromkeys(hosts, "this machine")
    return {h: f"{h[0]}[{h[1]}]" for h in hosts}


def plan_devices(
    plan: PlacementPlan,
    *,
    local_gpus: int,
    device: Device,
    trainer_procs: int,
    generator_replicas: int,
    tensor_parallel: int,
    reference: bool,
    kv_cache_gib: float | None,
) -> DeviceMap:
    """The device map of a run placed by `plan` (see the module docstring). `local_gpus`:
    the GPUs this machine has (`torch.cuda.device_count()`); `kv_cache_gib`: the generator's
    KV-cache reservation on a GPU (vLLM), None when its engine reserves none."""
    per_machine = {"local": local_gpus, "process": 0}.get(plan.launcher, plan.gpus_per_host)
    where = machines(plan)
    gpus = dict.fromkeys(dict.fromkeys(where.values()), per_machine)
    if device == "cuda" and per_machine == 0:
        raise DeviceError(_no_gpu(plan, local_gpus))
    if device == "cpu" or per_machine == 0:
        if tensor_parallel > 1:
            raise DeviceError(
                f"generator.tensor_parallel {tensor_parallel} needs GPUs; this run is on the CPU"
            )
        return _on_cpu(
            plan,
            gpus,
            where=where,
            trainer_procs=trainer_procs,
            generator_replicas=generator_replicas,
        )

    trainer_hosts = plan.hosts_of("trainer")
    per_host = plan.trainer_per_host(trainer_procs)
    trainer = tuple((where[h], r) for h in trainer_hosts for r in range(per_host))
    used = {where[h]: per_host for h in trainer_hosts}  # GPUs the trainer takes per machine

    if tensor_parallel > per_machine:
        raise DeviceError(
            f"generator.tensor_parallel {tensor_parallel} is larger than the {per_machine} "
            f"GPU(s) of a machine here: one replica's GPUs are on one machine"
        )
    gen_hosts = plan.hosts_of("generator")
    replicas_on: dict[str, int] = {}
    for i in range(generator_replicas):
        label = where[gen_hosts[i % len(gen_hosts)]]
        replicas_on[label] = replicas_on.get(label, 0) + 1
    # One offset for every host of the service (its replicas are pinned alike everywhere):
    # past the trainer's GPUs wherever the two share a machine.
    first = max((used.get(label, 0) for label in replicas_on), default=0)
    colocated = False
    for label, count in replicas_on.items():
        need = first + count * tensor_parallel
        if need <= per_machine:
            continue
        if per_machine == 1 and per_host == 1 and count == 1 and tensor_parallel == 1:
            first, colocated = 0, True  # one GPU: the trainer and the generator share it
            continue
        trainer_part = f"trainer {used.get(label, 0)} + " if used.get(label, 0) else ""
        raise DeviceError(
            f"{label} needs {need} GPUs ({trainer_part}generator {count} replica(s) x "
            f"tensor_parallel {tensor_parallel}) but has {per_machine}: lower "
            "--generator.replicas, --generator.tensor_parallel or --trainer.procs, or place "
            "the generator on other hosts (--placement.components)"
        )
    blocks: dict[str, int] = {}
    generator = []
    for i in range(generator_replicas):
        label = where[gen_hosts[i % len(gen_hosts)]]
        b = blocks.get(label, 0)
        blocks[label] = b + 1
        start = first + b * tensor_parallel
        generator.append((label, tuple(range(start, start + tensor_parallel))))

    ref = None
    ref_blocks = None
    if reference:
        ref_machine = where[plan.hosts_of("reference")[0]]
        if ref_machine not in used:
            raise DeviceError(
                "the reference model shares the trainer's GPU, so it runs where the trainer "
                f"runs: place it on the trainer's host mesh ({trainer_hosts[0][0]}) with "
                "--placement.components"
            )
        ref, ref_blocks = (ref_machine, 0), GpuBlocks(0, 1)
    return DeviceMap(
        gpus=gpus,
        trainer=trainer,
        generator=tuple(generator),
        reference=ref,
        generator_blocks=GpuBlocks(first, tensor_parallel),
        reference_blocks=ref_blocks,
        colocated=colocated,
        kv_cache_gib=kv_cache_gib,
    )


def _on_cpu(
    plan: PlacementPlan,
    gpus: dict[str, int],
    *,
    where: Mapping[tuple[str, int], str],
    trainer_procs: int,
    generator_replicas: int,
) -> DeviceMap:
    trainer_hosts = plan.hosts_of("trainer")
    per_host = plan.trainer_per_host(trainer_procs)
    gen_hosts = plan.hosts_of("generator")
    return DeviceMap(
        gpus=gpus,
        trainer=tuple((where[h], None) for h in trainer_hosts for _ in range(per_host)),
        generator=tuple(
            (where[gen_hosts[i % len(gen_hosts)]], ()) for i in range(generator_replicas)
        ),
        reference=None,
        generator_blocks=None,
        reference_blocks=None,
    )


def _no_gpu(plan: PlacementPlan, local_gpus: int) -> str:
    if plan.launcher == "process":
        return (
            "--device cuda: launcher process puts several hosts on this one machine and does "
            "not divide its GPUs among them; use launcher local, or --device auto (the CPU)"
        )
    if plan.launcher in ("slurm", "kubernetes"):
        setting = "slurm.gpus_per_node" if plan.launcher == "slurm" else "kubernetes.gpus_per_pod"
        return f"--device cuda: placement.{setting} is 0; set how many GPUs each host has"
    return (
        f"--device cuda: this machine has no CUDA device (torch sees {local_gpus}); run on a "
        "GPU machine, or give --device cpu to run this preset on the CPU (slowly)"
    )
