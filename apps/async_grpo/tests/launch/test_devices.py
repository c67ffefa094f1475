"""The device map: which GPUs each process takes, for 0 to 8 GPUs per host and several hosts,
decided on the CPU before anything starts."""

from __future__ import annotations

import re

import pytest
from async_grpo.config.placement import PlacementConfig, SlurmConfig
from async_grpo.launch.devices import DeviceError, DeviceMap, GpuBlocks, plan_devices
from async_grpo.launch.placement import Demand, PlacementPlan, plan_placement


def placed(
    trainer: int = 1, generators: int = 1, reference: bool = False, **placement: object
) -> PlacementPlan:
    demands = {
        "trainer": Demand(trainer),
        "generator": Demand(generators),
        "reward": Demand(1),
        "env": Demand(0),
        "buffer": Demand(1),
        "dataset": Demand(1),
        "reference": Demand(1 if reference else 0),
    }
    return plan_placement(PlacementConfig(**placement), demands)  # type: ignore[arg-type]


def devices(
    gpus: int,
    *,
    trainer: int = 1,
    generators: int = 1,
    tp: int = 1,
    reference: bool = False,
    device: str = "auto",
    kv: float | None = None,
    **placement: object,
) -> DeviceMap:
    plan = placed(trainer, generators, reference, **placement)
    return plan_devices(
        plan,
        local_gpus=gpus,
        device=device,  # type: ignore[arg-type]
        trainer_procs=trainer,
        generator_replicas=generators,
        tensor_parallel=tp,
        reference=reference,
        kv_cache_gib=kv,
    )


def gpus_of(m: DeviceMap) -> tuple[list[int | None], list[tuple[int, ...]]]:
    return [g for _, g in m.trainer], [g for _, g in m.generator]


@pytest.mark.parametrize(
    ("gpus", "trainer", "generators", "tp", "expect_trainer", "expect_generators", "colocated"),
    [
        # No GPU: everything on the CPU, whatever was asked for.
        (0, 1, 2, 1, [None], [(), ()], False),
        (0, 2, 1, 1, [None, None], [()], False),
        # One GPU: the trainer and one generator share it.
        (1, 1, 1, 1, [0], [(0,)], True),
        # Two: one each.
        (2, 1, 1, 1, [0], [(1,)], False),
        # Four: trainer 0, generators 1, 2, 3; or a 2-rank trainer and one TP-2 replica.
        (4, 1, 3, 1, [0], [(1,), (2,), (3,)], False),
        (4, 2, 1, 2, [0, 1], [(2, 3)], False),
        # Eight: a 4-rank trainer and two TP-2 replicas fill the machine exactly.
        (8, 4, 2, 2, [0, 1, 2, 3], [(4, 5), (6, 7)], False),
        (8, 2, 6, 1, [0, 1], [(2,), (3,), (4,), (5,), (6,), (7,)], False),
    ],
)
def test_one_machine(  # noqa: PLR0917 - one row of the table per case
    gpus: int,
    trainer: int,
    generators: int,
    tp: int,
    expect_trainer: list[int | None],
    expect_generators: list[tuple[int, ...]],
    colocated: bool,
) -> None:
    if gpus == 0 and tp > 1:
        pytest.skip("tensor parallelism needs GPUs (refused below)")
    m = devices(gpus, trainer=trainer, generators=generators, tp=tp)
    assert gpus_of(m) == (expect_trainer, expect_generators)
    assert m.colocated is colocated
    if gpus:
        first = 0 if colocated else trainer
        assert m.generator_blocks == GpuBlocks(first, tp)
        # No two replicas share a GPU, and none shares the trainer's unless colocated.
        taken = [g for gs in expect_generators for g in gs]
        assert len(taken) == len(set(taken))
        assert colocated or not set(taken) & {g for g in expect_trainer if g is not None}
    else:
        assert m.generator_blocks is None
        assert m.describe() == ["devices: every process on the CPU"]


@pytest.mark.parametrize(
    ("gpus", "trainer", "generators", "tp", "message"),
    [
        (1, 1, 2, 1, "this machine needs 3 GPUs (trainer 1 + generator 2 replica(s) x"),
        (1, 2, 1, 1, "this machine needs 3 GPUs (trainer 2 + generator 1 replica(s)"),
        (2, 1, 2, 1, "this machine needs 3 GPUs (trainer 1 + generator 2 replica(s) x "),
        (4, 2, 2, 2, "this machine needs 6 GPUs (trainer 2 + generator 2 replica(s) x "),
        (2, 1, 1, 4, "generator.tensor_parallel 4 is larger than the 2 GPU(s) of a machine"),
        (8, 1, 1, 16, "generator.tensor_parallel 16 is larger than the 8 GPU(s)"),
        (0, 1, 1, 2, "generator.tensor_parallel 2 needs GPUs; this run is on the CPU"),
    ],
)
def test_what_does_not_fit_is_refused_naming_the_numbers(
    gpus: int, trainer: int, generators: int, tp: int, message: str
) -> None:
    with pytest.raises(DeviceError, match=re.escape(message)):
        devices(gpus, trainer=trainer, generators=generators, tp=tp)


def test_the_reference_shares_the_trainers_gpu() -> None:
    m = devices(2, reference=True)
    assert m.reference == ("this machine", 0)
    assert m.reference_blocks == GpuBlocks(0, 1)
    assert m.reference_device == "cuda"
    assert "    this machine GPU 0: trainer rank 0, reference" in m.describe()
    assert devices(0, reference=True).reference is None  # on the CPU with everything else


def test_a_reference_away_from_the_trainer_is_refused() -> None:
    # Not named, it goes with the trainer; named elsewhere, it is refused.
    assert devices(
        0,
        reference=True,
        launcher="slurm",
        hosts="t=1,g=1",
        components="trainer=t,*=g",
        slurm=SlurmConfig(gpus_per_node=2),
    ).reference
    with pytest.raises(DeviceError, match="place it on the trainer's host mesh"):
        devices(
            0,
            reference=True,
            launcher="slurm",
            hosts="t=1,g=1",
            components="trainer=t,reference=g,*=g",
            slurm=SlurmConfig(gpus_per_node=2),
        )


def test_device_cpu_and_cuda() -> None:
    assert not devices(8, device="cpu").on_gpu  # the CPU even beside GPUs
    assert devices(8, device="cpu").trainer_device == "cpu"
    with pytest.raises(DeviceError, match="this machine has no CUDA device"):
        devices(0, device="cuda")
    assert devices(1, device="cuda").on_gpu


def test_several_hosts_count_gpus_per_host() -> None:
    # SLURM: a 2-host trainer (2 ranks a host) and 4 generator replicas on two other hosts,
    # 4 GPUs each: the generators start at GPU 0 of their own hosts.
    m = devices(
        0,  # this machine's GPUs do not matter for a scheduler's hosts
        trainer=4,
        generators=4,
        tp=2,
        launcher="slurm",
        hosts="t=2,g=2",
        components="trainer=t,*=g",
        slurm=SlurmConfig(gpus_per_node=4),
    )
    assert m.trainer == (("t[0]", 0), ("t[0]", 1), ("t[1]", 0), ("t[1]", 1))
    assert m.generator == (
        ("g[0]", (0, 1)),
        ("g[1]", (0, 1)),
        ("g[0]", (2, 3)),
        ("g[1]", (2, 3)),
    )
    assert m.generator_blocks == GpuBlocks(0, 2)
    assert m.gpus == {"t[0]": 4, "t[1]": 4, "g[0]": 4, "g[1]": 4}


def test_a_service_sharing_the_trainers_host_starts_after_its_gpus() -> None:
    # Generators on the trainer's host and on another: one offset for every host of the
    # service, past the trainer's GPUs.
    m = devices(
        0,
        trainer=2,
        generators=2,
        launcher="slurm",
        hosts="a=1,b=1",
        components="trainer=a,generator=a+b,*=b",
        slurm=SlurmConfig(gpus_per_node=4),
    )
    assert m.generator == (("a[0]", (2,)), ("b[0]", (2,)))
    with pytest.raises(DeviceError, match=r"a\[0\] needs 5 GPUs"):
        devices(
            0,
            trainer=2,
            generators=6,
            launcher="slurm",
            hosts="a=1,b=1",
            components="trainer=a,generator=a+b,*=b",
            slurm=SlurmConfig(gpus_per_node=4),
        )


def test_the_process_launcher_runs_everything_on_the_cpu() -> None:
    m = devices(8, launcher="process", hosts="a=1,b=1", components="trainer=a,*=b")
    assert not m.on_gpu
    with pytest.raises(DeviceError, match="launcher process puts several hosts on this one"):
        devices(8, device="cuda", launcher="process", hosts="a=1,b=1", components="trainer=a,*=b")


def test_the_start_line_names_every_gpu_and_the_colocated_shares() -> None:
    assert devices(1, kv=0.5).describe() == [
        "devices: this machine 1 GPU(s)",
        "    this machine GPU 0: trainer rank 0, generator replica 0",
        "    colocated: the generator holds the model and its 0.5 GiB KV cache; the trainer "
        "the rest",
    ]
    assert devices(4, trainer=2, generators=1, tp=2).describe() == [
        "devices: this machine 4 GPU(s)",
        "    this machine GPU 0: trainer rank 0",
        "    this machine GPU 1: trainer rank 1",
        "    this machine GPU 2: generator replica 0",
        "    this machine GPU 3: generator replica 0",
    ]
