"""Environments as `actor-service` services: replicas that each hold many episodes.

    env = await spawn_environment("repeat", ServiceConfig(replicas=4, name="repeat"))
    async with env.episode() as ep:                 # a sticky session: one replica
        obs = await ep.reset(Task("repeat", seed=7))
        result = await ep.step(Action("banana"))
    await env.shutdown()

Each episode is its own environment instance inside a replica, keyed by a random episode
id, so one replica serves many concurrent episodes. `reset` is idempotent (a reset in flight
on a replica that dies runs again elsewhere); `step` is not (`ReplicaDiedError` instead of a
step replayed on a replica that never saw the episode). A replica asked about an episode it
does not hold, because the replica that held it died and this one replaced it, raises
`EpisodeLostError`. `run_episode` turns both into a failed episode.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from actor_service import (
    Service,
    ServiceConfig,
    ServiceHandle,
    ServiceStatus,
    Session,
    non_idempotent,
    spawn_service,
)
from actor_service.routers import supports_sessions
from monarch.actor import Actor, HostMesh
from monarch.actor.concurrent import concurrent_endpoint

from rl_envs.environment import Environment
from rl_envs.errors import EnvError, EpisodeLostError
from rl_envs.registry import EnvFactory, resolve
from rl_envs.types import Action, EnvState, Observation, StepResult, Task

MAX_EPISODES = 4096
"""Open episodes one replica holds at most; `reset` of one more raises `EnvError` (an app
that never closes its episodes fails loudly instead of growing without bound)."""


class EnvironmentActor(Actor):
    """One replica of an environment service: `factory(**kwargs)` builds the environment of
    each episode. The first instance is built in `__init__`, so a factory that cannot work
    here (a missing sandbox, a bad argument) fails the replica's start. Endpoints are
    concurrent: while one episode waits (a sandboxed program, an OpenEnv server), others
    go on, up to `ServiceConfig.max_in_flight_per_replica` calls at once."""

    def __init__(self, factory: EnvFactory, kwargs: dict[str, Any]) -> None:
        self._factory = factory
        self._kwargs = kwargs
        self._spare: Environment | None = self._build()
        self.env_name = self._spare.name
        self._episodes: dict[str, Environment] = {}

    def _build(self) -> Environment:
        env = self._factory(**self._kwargs)
        if not isinstance(env, Environment):
            raise TypeError(
                f"environment factory {self._factory!r} returned {type(env).__name__}, "
                "not an rl_envs.Environment"
            )
        return env

    def _get(self, episode: str) -> Environment:
        env = self._episodes.get(episode)
        if env is None:
            raise EpisodeLostError(
                f"episode {episode} is not on this replica of {self.env_name!r}: the replica "
                "that held it died (or the episode was closed)"
            )
        return env

    @concurrent_endpoint
    async def name(self) -> str:
        """The environment's name (what `Task.env` must say)."""
        return self.env_name

    @concurrent_endpoint
    async def reset(self, episode: str, task: Task) -> Observation:
        """Starts `task` as episode `episode` (restarts it if it exists)."""
        env = self._episodes.get(episode)
        if env is None:
            if len(self._episodes) >= MAX_EPISODES:
                raise EnvError(
                    f"{self.env_name}: {MAX_EPISODES} episodes are open on this replica; "
                    "close finished episodes (run_episode does)"
                )
            env, self._spare = self._spare or self._build(), None
        observation = await env.reset(task)
        self._episodes[episode] = env
        return observation

    @non_idempotent
    @concurrent_endpoint
    async def step(self, episode: str, action: Action) -> StepResult:
        """One turn of episode `episode`."""
        return await self._get(episode).step(action)

    @concurrent_endpoint
    async def state(self, episode: str) -> EnvState:
        return await self._get(episode).state()

    @concurrent_endpoint
    async def close(self, episode: str) -> None:
        """Forgets episode `episode` (no error if it is not here)."""
        env = self._episodes.pop(episode, None)
        if env is not None:
            await env.close()

    @concurrent_endpoint
    async def open_episodes(self) -> int:
        return len(self._episodes)


class RemoteEpisode:
    """One episode on an environment service, pinned to a replica by a sticky session.
    Get it from `EnvironmentService.episode()`."""

    def __init__(self, session: Session, env_name: str) -> None:
        self.id = uuid.uuid4().hex
        self.env_name = env_name
        self._session = session

    # The actor's endpoints are concurrent ones, which Monarch leaves untyped: the results
    # are annotated here.
    async def reset(self, task: Task) -> Observation:
        observation: Observation = await self._session.endpoint("reset").route(self.id, task)
        return observation

    async def step(self, action: Action) -> StepResult:
        result: StepResult = await self._session.endpoint("step").route(self.id, action)
        return result

    async def state(self) -> EnvState:
        state: EnvState = await self._session.endpoint("state").route(self.id)
        return state

    async def close(self) -> None:
        await self._session.endpoint("close").route(self.id)


class EnvironmentService:
    """An environment served by replicas. Build it with `spawn_environment`; inside other
    actors, use `service.handle()` (picklable, same API)."""

    def __init__(self, backend: Service[EnvironmentActor] | ServiceHandle, name: str) -> None:
        self._backend = backend
        self.name = name

    @property
    def service(self) -> Service[EnvironmentActor] | ServiceHandle:
        """The underlying actor-service service (status, listeners, ...)."""
        return self._backend

    @asynccontextmanager
    async def episode(self) -> AsyncIterator[RemoteEpisode]:
        """A new episode in a sticky session; closed (on its replica) on exit."""
        async with self._backend.session() as session:
            ep = RemoteEpisode(session, self.name)
            try:
                yield ep
            finally:
                with contextlib.suppress(Exception):  # its replica died: nothing to close
                    await ep.close()

    def status(self) -> ServiceStatus:
        """The service's `ServiceStatus` (per replica: state, deaths, restarts, load)."""
        if isinstance(self._backend, ServiceHandle):
            raise TypeError("status() is available where the service was spawned")
        return self._backend.status()

    def handle(self) -> EnvironmentService:
        """A picklable copy for other actors (calls go through the service's process)."""
        if isinstance(self._backend, ServiceHandle):
            return self
        return EnvironmentService(self._backend.handle(), self.name)

    async def shutdown(self) -> None:
        if isinstance(self._backend, ServiceHandle):
            raise TypeError("shut the service down where it was spawned, not from a handle")
        await self._backend.shutdown()

    async def __aenter__(self) -> EnvironmentService:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    def __getstate__(self) -> dict[str, Any]:
        if not isinstance(self._backend, ServiceHandle):
            raise TypeError("an EnvironmentService cannot be pickled; send service.handle()")
        return {"_backend": self._backend, "name": self.name}

    def __repr__(self) -> str:
        return f"EnvironmentService({self.name!r}, {self._backend!r})"


async def spawn_environment(
    env: str | EnvFactory,
    config: ServiceConfig | None = None,
    *,
    hosts: HostMesh | Sequence[HostMesh] | None = None,
    **kwargs: Any,
) -> EnvironmentService:
    """Serves an environment from `config.replicas` replicas (default: one, named after
    the environment). `env` is a registered name (`UnknownEnvironmentError` otherwise,
    before anything starts) or a factory: an `Environment` subclass or a picklable callable
    returning one, called as `factory(**kwargs)` in each replica. The router must keep
    sessions (the default `Sticky` does). `hosts`: the Monarch host meshes the replicas
    spread over (`actor_service.spawn_service`'s `hosts`); left out, this host."""
    factory = resolve(env) if isinstance(env, str) else env
    if not callable(factory):
        raise TypeError(f"env must be a registered name or a factory, got {env!r}")
    if config is None:
        label = env if isinstance(env, str) else getattr(factory, "name", "") or "env"
        config = ServiceConfig(name=label if label.isidentifier() else "env")
    if not isinstance(config, ServiceConfig):
        raise TypeError(f"config must be a ServiceConfig, got {type(config).__name__}")
    if not supports_sessions(config.router):
        raise ValueError(
            "an environment service needs a router that keeps sessions on a replica "
            f"(Sticky), got {type(config.router).__name__}"
        )
    service = await spawn_service(EnvironmentActor, config, factory, dict(kwargs), hosts=hosts)
    try:
        name: str = await service.endpoint("name").route()
    except BaseException:
        await service.shutdown()
        raise
    return EnvironmentService(service, name)
