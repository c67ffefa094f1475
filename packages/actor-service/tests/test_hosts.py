"""Replicas on given host meshes, with real local "hosts": Monarch's `ProcessJob` starts
each host as a subprocess running Monarch's worker loop, and a host dies for real when that
worker is SIGKILLed (its processes die with it)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import pytest
from actor_service import RoundRobin, ServiceConfig, spawn_service
from helpers import Recorder, wait_until
from monarch.actor import this_host
from monarch.job import ProcessJob
from procs import descendants
from service_actors import Echo

HOST_NAME = "HYPERACTOR_PROCESS_NAME"  # "<proc> @ <host>" in a ProcessJob host's processes

# A restart that finds its host dead waits for Monarch to give up spawning there
# (`mesh_proc_spawn_max_idle`, 30 s by default) before it tries another host.
RECOVERY_S = 180.0


@pytest.fixture
def job() -> Iterator[ProcessJob]:
    job = ProcessJob({"a": 1, "b": 1, "w": 2})
    yield job
    job.kill()  # type: ignore[no-untyped-call]  # monarch leaves it unannotated


def host_of(names: list[tuple[int, str | None]]) -> list[str]:
    return [str(name).split(" @ ")[-1] for _, name in names]


async def test_replicas_spread_round_robin_over_every_host_given(job: ProcessJob) -> None:
    state = job.state(cached_path=None)
    config = ServiceConfig(replicas=4, with_gpus=True, name="spread")
    # `w` is a mesh of two hosts: each of them is one host of the service.
    async with await spawn_service(Echo, config, hosts=[state.a, state.w]) as svc:
        assert host_of(await svc.env.fanout(HOST_NAME)) == ["a_0", "w_0", "w_1", "a_0"]
        status = svc.status()
        assert [r.host for r in status.replicas] == [0, 1, 2, 0]
        assert status.hosts_down == ()
        # GPUs are counted per host: the second replica on host 0 takes its next GPU.
        gpus = [gpu for _, gpu in await svc.env.fanout("CUDA_VISIBLE_DEVICES")]
        assert gpus == ["0", "0", "0", "1"]
        assert "host 2" in str(status)


async def test_replicas_of_a_host_that_dies_come_back_on_a_surviving_host(
    job: ProcessJob,
) -> None:
    state = job.state(cached_path=None)
    config = ServiceConfig(
        replicas=3,
        router=RoundRobin(),
        call_timeout_s=5.0,  # a dead host's replicas never answer: this finds them
        restart_backoff_s=0.3,
        name="hosts",
    )
    async with await spawn_service(Echo, config, hosts=[state.a, state.b]) as svc:
        seen = Recorder()
        svc.add_listener(seen)
        pids = await svc.pid.fanout()
        assert host_of(await svc.env.fanout(HOST_NAME)) == ["a_0", "b_0", "a_0"]

        os.kill(job._host_to_pid["a_0"].pid, signal.SIGKILL)
        # The service keeps answering: calls sent to the dead host's replicas time out
        # there and are answered by the replica on host b.
        results = await asyncio.gather(*(svc.echo.route(i) for i in range(12)))
        assert [x for x, _ in results] == list(range(12))
        assert {pid for _, pid in results} == {pids[1]}

        status = await wait_until(svc, lambda s: s.healthy == 3, within=RECOVERY_S)
        assert [r.host for r in status.replicas] == [1, 1, 1]
        assert status.hosts_down == (0,)
        assert host_of(await svc.env.fanout(HOST_NAME)) == ["b_0", "b_0", "b_0"]
        assert [r.restarts for r in status.replicas] == [1, 0, 1]  # one attempt each
        assert {status.replicas[0].pids[0], status.replicas[2].pids[0]}.isdisjoint(pids)
        assert "hosts down [0]" in str(status)

        events = await seen.wait_for(4)
        assert sorted(seen.kinds()) == [(0, "died"), (0, "up"), (2, "died"), (2, "up")]
        assert sorted((e.replica, e.kind, e.host) for e in events) == [
            (0, "died", 0),
            (0, "up", 1),
            (2, "died", 0),
            (2, "up", 1),
        ]
        served = {pid for _, pid in await asyncio.gather(*(svc.echo.route(i) for i in range(6)))}
        assert served == {r.pids[0] for r in status.replicas}


@pytest.mark.parametrize(
    ("hosts", "error", "message"),
    [
        ([], ValueError, "hosts is empty"),
        ("a_0", TypeError, "hosts must be a HostMesh or a list of them"),
        (["a_0"], TypeError, r"hosts\[0\] is not a monarch HostMesh \(got str\)"),
        ("this_host, then 3", TypeError, r"hosts\[1\] is not a monarch HostMesh \(got int\)"),
    ],
)
async def test_bad_hosts_are_refused_before_anything_starts(
    hosts: object, error: type[Exception], message: str
) -> None:
    if hosts == "this_host, then 3":
        hosts = [this_host(), 3]
    before = descendants()
    with pytest.raises(error, match=message):
        await spawn_service(Echo, ServiceConfig(name="nowhere"), hosts=hosts)  # type: ignore[arg-type]
    assert descendants() - before == set()
