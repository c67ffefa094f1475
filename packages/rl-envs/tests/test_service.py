"""Environments served by real Monarch replicas: whole episodes in sticky sessions, and a
replica that dies mid-episode failing only that episode, cleanly."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Sequence

import pytest
from actor_service import ReplicaStartError, ServiceConfig
from env_actors import Crashy, Player
from monarch.actor import ActorError
from policies import Oracle, Payload
from rl_envs import (
    Action,
    ActionTypeError,
    EnvironmentService,
    EpisodeDoneError,
    FollowThePattern,
    Policy,
    PolicyTurn,
    Segment,
    Task,
    UnknownEnvironmentError,
    run_episode,
    spawn_environment,
)

# Several processes, seconds each: not in `nox -s fast`.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


async def test_concurrent_episodes_on_two_replicas() -> None:
    config = ServiceConfig(replicas=2, name="repeat")
    async with await spawn_environment("repeat", config) as env:
        tasks = [Task("repeat", seed=s, level=s % 3) for s in range(12)]
        records = await asyncio.gather(*(run_episode(Oracle(), env, t) for t in tasks))
        assert all(r.ok and r.done for r in records)
        assert [r.reward for r in records] == pytest.approx([1.0] * 12)
        assert [r.task for r in records] == tasks
        status = env.status()
        assert all(rep.completed > 0 for rep in status.replicas)  # both served
        counts = await env.service.endpoint("open_episodes").fanout()
        assert counts == [0, 0]  # every episode was closed


async def test_unknown_environment_fails_before_spawning() -> None:
    with pytest.raises(UnknownEnvironmentError, match="unknown environment 'chess'"):
        await spawn_environment("chess")


async def test_bad_calls_come_back_named_and_change_nothing() -> None:
    async with await spawn_environment("pattern") as env, env.episode() as ep:
        await ep.reset(Task("pattern", seed=2))
        with pytest.raises(ActorError) as wrong_type:
            await ep.step("answer")  # type: ignore[arg-type]
        assert isinstance(wrong_type.value.exception, ActionTypeError)
        assert (await ep.state()).turns == 0
        rules, cues = FollowThePattern.content(Task("pattern", seed=2))
        for cue in cues:
            await ep.step(Action(dict(rules)[cue]))
        finished = await ep.state()
        assert finished.done
        assert finished.total_reward == pytest.approx(1.0)
        with pytest.raises(ActorError) as after_done:
            await ep.step(Action("again"))
        assert isinstance(after_done.value.exception, EpisodeDoneError)
        assert await ep.state() == finished


class KillBetweenSteps:
    """Answers turn 0, then SIGKILLs the replica serving the episode (its pid is in the
    observation) and waits until the service has noticed, before answering turn 1."""

    def __init__(self, env: EnvironmentService) -> None:
        self.env = env
        self.killed: int | None = None

    async def __call__(self, conversation: Sequence[Segment[Payload]]) -> PolicyTurn[Payload]:
        if len(conversation) == 3 and self.killed is None:
            self.killed = int(conversation[-1].text.split()[1])
            os.kill(self.killed, signal.SIGKILL)
            for _ in range(200):  # Monarch notices within its 1 s supervision poll
                if sum(r.deaths for r in self.env.status().replicas) > 0:
                    break
                await asyncio.sleep(0.05)
        return PolicyTurn("ok", ())


async def test_replica_killed_between_steps_fails_that_episode_only() -> None:
    config = ServiceConfig(replicas=2, name="crashy", restart_backoff_s=0.1)
    async with await spawn_environment(Crashy, config) as env:
        killer = KillBetweenSteps(env)
        doomed = run_episode(killer, env, Task("crashy", seed=0))
        record = await doomed
        assert killer.killed is not None
        assert not record.ok
        assert record.error is not None
        assert record.error.kind == "replica_died"
        assert record.error.turns == 1
        assert record.segments == ()  # nothing of it can be trained on
        assert record.reward == 0.0
        # The service carries on: new episodes complete.
        again = await run_episode(AlwaysOk(), env, Task("crashy", seed=1))
        assert again.ok
        assert again.reward == pytest.approx(1.0)


class AlwaysOk:
    async def __call__(self, conversation: Sequence[Segment[Payload]]) -> PolicyTurn[Payload]:
        return PolicyTurn("ok", ())


async def test_replica_dying_mid_step_and_environment_errors() -> None:
    config = ServiceConfig(replicas=1, name="crashy", restart_backoff_s=0.1)
    async with await spawn_environment(Crashy, config) as env:

        def saying(*answers: str) -> Policy[Payload]:
            it = iter(answers)

            async def policy(conversation: Sequence[Segment[Payload]]) -> PolicyTurn[Payload]:
                return PolicyTurn(next(it), ())

            return policy

        crashed = await run_episode(saying("ok", "crash"), env, Task("crashy", seed=0))
        assert crashed.error is not None
        assert crashed.error.kind == "replica_died"
        assert crashed.error.turns == 1
        assert "ReplicaDiedError" in crashed.error.message

        failing = await run_episode(saying("raise"), env, Task("crashy", seed=0))
        assert failing.error is not None
        assert failing.error.kind == "environment_error"
        assert "RuntimeError: the environment's own bug" in failing.error.message

        fine = await run_episode(saying("a", "b", "c"), env, Task("crashy", seed=0))
        assert fine.ok
        assert fine.done


async def test_a_factory_that_cannot_build_fails_the_start() -> None:
    with pytest.raises(ReplicaStartError, match="Calculator attempts must be an int >= 1"):
        await spawn_environment("calculator", attempts=0)


async def test_episodes_from_another_actor_through_a_handle() -> None:
    from monarch.actor import this_host  # noqa: PLC0415

    async with await spawn_environment("repeat", ServiceConfig(replicas=2, name="repeat")) as env:
        procs = this_host().spawn_procs(per_host={"procs": 1})
        player = procs.spawn("player", Player)
        results = [await player.play.call_one(env.handle(), seed) for seed in range(3)]
        assert [ok for ok, _ in results] == [True] * 3
        assert [reward for _, reward in results] == pytest.approx([1.0] * 3)
        await procs.stop()


async def test_replicas_on_given_hosts_serve_episodes() -> None:
    """`hosts` spreads the replicas over Monarch hosts: here two local hosts of a
    `ProcessJob` (subprocesses running Monarch's worker loop)."""
    from monarch.job import ProcessJob  # noqa: PLC0415

    job = ProcessJob({"a": 1, "b": 1})
    try:
        state = job.state(cached_path=None)
        config = ServiceConfig(replicas=2, name="repeat")
        async with await spawn_environment("repeat", config, hosts=[state.a, state.b]) as env:
            records = [await run_episode(Oracle(), env, Task("repeat", seed=s)) for s in range(4)]
            assert all(r.ok and r.done for r in records)
            status = env.status()
            assert [r.host for r in status.replicas] == [0, 1]
            # Each replica's process was started by its host's worker ("<proc> @ <host>").
            names = [_process_name(r.pids[0]) for r in status.replicas]
            assert [n.rpartition(" @ ")[2] for n in names] == ["a_0", "b_0"], names
    finally:
        job.kill()  # type: ignore[no-untyped-call]  # Monarch's job API is untyped


def _process_name(pid: int) -> str:
    with open(f"/proc/{pid}/environ", "rb") as f:
        variables = dict(v.partition(b"=")[::2] for v in f.read().split(b"\0") if v)
    return variables[b"HYPERACTOR_PROCESS_NAME"].decode()
