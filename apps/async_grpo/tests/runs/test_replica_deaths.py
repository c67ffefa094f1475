"""A generator replica killed mid-run: the run goes on, says so in one line when the replica
dies (with where it was, when it could write its stacks) and one when it is back, and counts
both in the metrics; the restarted replica pulls the newest weights before it serves."""

import asyncio
import os
import signal
from pathlib import Path

import pytest
import torch
from actor_service import ServiceConfig, spawn_service
from async_grpo.actors.generator import Generator
from async_grpo.actors.trainer import TrainResult
from async_grpo.config.presets import tiny
from async_grpo.config.schema import ModelConfig, SamplingConfig
from async_grpo.launch.prepare import prepare
from async_grpo.launch.spawn import Components
from async_grpo.model.policy import load_policy
from async_grpo.observability.metrics import StepRow
from async_grpo.train import run
from jobs import keeping, rows
from rdma_tensor import Publisher

pytestmark = pytest.mark.slow  # a whole run (or a whole set of processes)


@pytest.mark.timeout(300)
def test_a_killed_generator_is_reported_and_counted(
    tmp_path: Path,
) -> None:
    cfg = tiny()
    cfg.steps, cfg.eval_every, cfg.out_dir = 20, 0, str(tmp_path)
    started: list[Components] = []
    killed: list[int] = []

    def on_step(row: StepRow, result: TrainResult) -> None:
        del result
        if row.version == 5:
            (pid,) = started[0].generator.status().replicas[0].pids
            os.kill(pid, signal.SIGABRT)  # as a native library's failed check ends it
            killed.append(pid)

    lines: list[str] = []
    asyncio.run(
        run(
            cfg, prepare(cfg), quiet=True, on_step=on_step, log=lines.append, spawn=keeping(started)
        )
    )

    assert killed
    got = rows(tmp_path)
    # The trainer needs fresh episodes for every step after the kill, so the run could only
    # finish with the replica back.
    assert got[-1]["version"] == 20
    assert got[-1]["replica_deaths"] == 1
    assert got[-1]["replica_restarts"] == 1
    assert all(r["replica_deaths"] == 0 for r in got if r["version"] <= 5)
    died = [x for x in lines if "generator replica 0 died" in x]
    back = [x for x in lines if "generator replica 0 is back after" in x]
    assert len(died) == 1, lines
    stacks = tmp_path / "crashes" / f"generator-{killed[0]}.txt"
    assert f"; pid {killed[0]} crashed in " in died[0], died
    assert f"(Fatal Python error: Aborted), stacks in {stacks}; restarting it" in died[0], died
    assert "(most recent call first)" in stacks.read_text()
    assert len(back) == 1, lines
    assert lines.index(died[0]) < lines.index(back[0])


@pytest.mark.timeout(300)
def test_a_restarted_generator_pulls_the_weights_before_it_serves(tiny_checkpoint: Path) -> None:
    # A restarted replica starts from the checkpoint (version 0); a request that brings the
    # newest weights (version 3, here every weight halved) is served with them.
    model = load_policy(str(tiny_checkpoint), torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(0.5)
    config = ServiceConfig(replicas=1, name="generator", no_healthy_timeout_s=240)
    sampling = SamplingConfig(group_size=2, max_new_tokens=4)

    async def main() -> None:
        svc = await spawn_service(
            Generator, config, str(tiny_checkpoint), ModelConfig(), sampling, 0
        )
        publisher = Publisher()
        try:
            update = publisher.publish(model.state_dict(), 3)
            (pid,) = svc.status().replicas[0].pids
            os.kill(pid, signal.SIGKILL)
            groups = await svc.endpoint(Generator.generate).route(["count to 2:"], 1, update)
            assert svc.status().replicas[0].deaths == 1  # served by the restarted replica
            assert {c.policy_version for c in groups[0]} == {3}
            version, weights = await svc.endpoint(Generator.weights).route()
            assert version == 3
            for name, param in model.named_parameters():
                assert torch.equal(weights[name], param), name
        finally:
            await svc.shutdown()
            publisher.close()

    asyncio.run(main())
