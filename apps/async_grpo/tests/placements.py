"""Placements the placement tests share, in a module of their own: the SLURM batch-script
test imports them in a subprocess, which then needs none of the app's heavy imports."""

from __future__ import annotations

from async_grpo.config.placement import PlacementConfig, SlurmConfig
from async_grpo.launch.placement import Demand

RUN = {  # what the tiny preset starts
    "trainer": Demand(1),
    "generator": Demand(1),
    "reward": Demand(1),
    "env": Demand(0),
    "buffer": Demand(1),
    "dataset": Demand(1),
    "reference": Demand(0),
}

SLURM = PlacementConfig(
    launcher="slurm",
    hosts="trainer=2,gen=1",
    components="trainer=trainer,*=gen",
    slurm=SlurmConfig(
        partition="h100",
        time_limit="02:00:00",
        gpus_per_node=8,
        python="/shared/venv/bin/python",
        sbatch_args="--constraint=ib --nice=10",
    ),
)
