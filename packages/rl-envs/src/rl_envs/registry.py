"""Environments by name: `make("repeat")`, `register("mine", MyEnv)`, `names()`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rl_envs._checks import check_name
from rl_envs.environment import Environment
from rl_envs.envs import Calculator, FollowThePattern, RepeatAfterMe
from rl_envs.errors import UnknownEnvironmentError

EnvFactory = Callable[..., Environment]
"""Builds an environment: a class, or any picklable callable returning an instance."""

_REGISTRY: dict[str, EnvFactory] = {
    RepeatAfterMe.name: RepeatAfterMe,
    FollowThePattern.name: FollowThePattern,
    Calculator.name: Calculator,
}


def register(name: str, factory: EnvFactory) -> None:
    """Makes `factory` known as `name`; a name already taken is an error. (A registration
    lives in this process: to serve the environment from replicas, give `spawn_environment`
    the factory itself, which travels with the spawn.)"""
    check_name("an environment name", name)
    if name in _REGISTRY:
        raise ValueError(f"an environment named {name!r} is already registered")
    if not callable(factory):
        raise TypeError(f"factory for {name!r} must be callable, got {type(factory).__name__}")
    _REGISTRY[name] = factory


def names() -> list[str]:
    """Every registered name, sorted."""
    return sorted(_REGISTRY)


def resolve(name: str) -> EnvFactory:
    """The factory registered as `name`, or `UnknownEnvironmentError` listing the known."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise UnknownEnvironmentError(
            f"unknown environment {name!r}; known: {', '.join(names())}"
        ) from None


def make(name: str, **kwargs: Any) -> Environment:
    """A new instance of the environment registered as `name`."""
    return resolve(name)(**kwargs)
