"""The whole app on several Monarch hosts: three local hosts of a `ProcessJob` (each a
subprocess running Monarch's worker loop, as a remote machine would), each host mesh
declaring a machine of its own, so that the weights go from the trainer to the generators
by Monarch RDMA (its TCP fallback here), as between computers.

A run there learns as a one-host run does; a host whose worker is SIGKILLed mid-run takes
its replicas with it, and they come back on the surviving host."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from async_grpo.actors.trainer import TrainResult
from async_grpo.config.placement import PlacementConfig, three_local_hosts
from async_grpo.config.presets import tiny
from async_grpo.launch.prepare import prepare
from async_grpo.launch.spawn import Components
from async_grpo.observability.metrics import StepRow
from async_grpo.train import run
from jobs import keeping, rows

pytestmark = pytest.mark.slow  # a whole run (or a whole set of processes)


def process_env(pid: int) -> dict[str, str]:
    """The environment a process started with."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = (v.decode().partition("=") for v in f.read().split(b"\0") if v)
        return {k: v for k, _, v in pairs}


@pytest.mark.timeout(400)
def test_a_run_on_three_hosts_learns(tmp_path: Path) -> None:
    # The same run as test_export_eval's one-host full run (steps, seed, bounds), on three
    # hosts: trainer on a, the generator on b, reward, buffer and dataset on c.
    cfg = tiny()
    cfg.steps, cfg.seed, cfg.out_dir, cfg.max_minutes = 120, 0, str(tmp_path), 10.0
    cfg.placement = three_local_hosts()
    started: list[Components] = []
    where: dict[str, dict[str, str]] = {}

    def on_step(row: StepRow, result: TrainResult) -> None:
        del row, result
        if not where:  # each replica's process: the host that started it, its machine
            for name in ("generator", "reward"):
                (pid,) = getattr(started[0], name).status().replicas[0].pids
                where[name] = process_env(pid)

    metrics = asyncio.run(
        run(cfg, prepare(cfg), quiet=True, on_step=on_step, log=print, spawn=keeping(started))
    ).metrics
    got = rows(tmp_path)
    assert got[-1]["version"] == 120  # finished within the time limit
    start, end = got[0]["reward_window"], metrics.reward_window()
    assert start <= 0.3
    assert end - start >= 0.3, (start, end)
    # The evaluation of the initial and of the final weights (every prompt, 16 samples).
    assert metrics.evals[-1].reward - metrics.evals[0].reward >= 0.3, metrics.evals
    assert all(r["staleness_mean"] <= cfg.buffer.max_policy_age for r in got)
    # Every version reached the generator over RDMA: another machine's memory, not mapped.
    assert {str(r["weight_sync_transport"]) for r in got} == {"rdma"}
    for name, host in (("generator", "b"), ("reward", "c")):
        assert where[name]["HYPERACTOR_PROCESS_NAME"].endswith(f" @ {host}_0"), where
        assert where[name]["RDMA_TENSOR_MACHINE_ID"] == host


@pytest.mark.timeout(420)
def test_a_dead_host_s_replicas_come_back_on_the_surviving_host(
    tmp_path: Path,
) -> None:
    # The generator's and the reward's only replicas run on host b, with host c given to
    # both services as a spare; the trainer, buffer and dataset are on host a. Killing b's
    # Monarch worker kills both replicas at once. The trainer needs fresh episodes for every
    # step, so the run can only finish once both are back, on c.
    cfg = tiny()
    cfg.steps, cfg.eval_every, cfg.out_dir = 16, 0, str(tmp_path)
    cfg.placement = PlacementConfig(
        launcher="process",
        hosts="a=1,b=1,c=1",
        components="trainer=a,generator=b+c,reward=b+c,*=a",
        split_machines=True,
        call_timeout_s=15.0,  # the dead host's replicas never answer: this finds them
        spawn_timeout_s=10.0,  # and this gives up on starting them again there
    )
    started: list[Components] = []
    killed: list[int] = []
    seen: dict[str, tuple[int, tuple[int, ...]]] = {}

    def on_step(row: StepRow, result: TrainResult) -> None:
        del result
        c = started[0]
        if row.version == 4:
            (pid,) = [p.pid for key, p in c.hosts.jobs["b"]._host_to_pid.items() if key == "b_0"]
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        if row.version == cfg.steps:
            for name in ("generator", "reward"):
                status = getattr(c, name).status()
                seen[name] = (status.replicas[0].host, status.hosts_down)

    lines: list[str] = []

    def log(line: str) -> None:
        print(line)  # shown when the test fails
        lines.append(line)

    asyncio.run(
        run(cfg, prepare(cfg), quiet=True, on_step=on_step, log=log, spawn=keeping(started))
    )

    assert killed
    got = rows(tmp_path)
    assert got[-1]["version"] == cfg.steps
    assert all(r["replica_deaths"] == 0 for r in got if r["version"] <= 4)
    assert got[-1]["replica_deaths"] == 2
    assert got[-1]["replica_restarts"] == 2
    # Both replicas run on host c (the services' host 1), b (host 0) is marked down.
    assert seen == {"generator": (1, (0,)), "reward": (1, (0,))}
    for name in ("generator", "reward"):
        # Found by the call timeout ("hung: no answer ...") if a call was in flight on it,
        # else by Monarch's supervision ("no status received from process").
        died = [x for x in lines if f"{name} replica 0 died: " in x]
        back = [x for x in lines if f"{name} replica 0 is back after" in x]
        assert len(died) == 1, lines
        assert len(back) == 1, lines
        assert lines.index(died[0]) < lines.index(back[0])
    # The replica on c got the newest weights from the trainer on a, by RDMA.
    assert str(got[-1]["weight_sync_transport"]) == "rdma"
