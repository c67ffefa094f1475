"""Environments for RL on LLMs, served as `actor-service` services.

    env = await spawn_environment("repeat", ServiceConfig(replicas=2, name="repeat"))
    record = await run_episode(policy, env, Task("repeat", seed=0))   # a whole episode
    sandbox = Sandbox()                                               # bubblewrap
    result = await sandbox.arun("print(6 * 7)")

The contract (`Environment`, `Task`, `Action`, `Observation`, `StepResult`, `EnvState`),
the built-in environments, the sandbox and the data-side patterns (`TaskMixture`,
`Curriculum`) import no Monarch; the service and episode parts import it on
first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rl_envs.curriculum import Curriculum, LevelChange
from rl_envs.environment import Environment, GeneratedEnvironment
from rl_envs.envs import Calculator, FollowThePattern, RepeatAfterMe
from rl_envs.errors import (
    ActionTypeError,
    EnvError,
    EpisodeDoneError,
    EpisodeLostError,
    EpisodeNotStartedError,
    UnknownEnvironmentError,
)
from rl_envs.mixture import TaskMixture
from rl_envs.registry import make, names, register
from rl_envs.sandbox import ExecutionResult, Sandbox, SandboxLimits, SandboxUnavailableError
from rl_envs.types import Action, EnvState, Observation, StepResult, Task

if TYPE_CHECKING:
    from rl_envs.episode import (
        EpisodeError,
        EpisodeRecord,
        Policy,
        PolicyTurn,
        Segment,
        run_episode,
    )
    from rl_envs.evaluation import EvalResult, evaluate
    from rl_envs.service import EnvironmentActor, EnvironmentService, spawn_environment
    from rl_envs.tokens import TokenizedEpisode, context_ids, tokenize_episode

_LAZY = {
    "EpisodeError": "rl_envs.episode",
    "EpisodeRecord": "rl_envs.episode",
    "Policy": "rl_envs.episode",
    "PolicyTurn": "rl_envs.episode",
    "Segment": "rl_envs.episode",
    "run_episode": "rl_envs.episode",
    "EvalResult": "rl_envs.evaluation",
    "evaluate": "rl_envs.evaluation",
    "EnvironmentActor": "rl_envs.service",
    "EnvironmentService": "rl_envs.service",
    "spawn_environment": "rl_envs.service",
    "TokenizedEpisode": "rl_envs.tokens",
    "context_ids": "rl_envs.tokens",
    "tokenize_episode": "rl_envs.tokens",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'rl_envs' has no attribute {name!r}")


__version__ = "0.1.0"

__all__ = [
    "Action",
    "ActionTypeError",
    "Calculator",
    "Curriculum",
    "EnvError",
    "EnvState",
    "Environment",
    "EnvironmentActor",
    "EnvironmentService",
    "EpisodeDoneError",
    "EpisodeError",
    "EpisodeLostError",
    "EpisodeNotStartedError",
    "EpisodeRecord",
    "EvalResult",
    "ExecutionResult",
    "FollowThePattern",
    "GeneratedEnvironment",
    "LevelChange",
    "Observation",
    "Policy",
    "PolicyTurn",
    "RepeatAfterMe",
    "Sandbox",
    "SandboxLimits",
    "SandboxUnavailableError",
    "Segment",
    "StepResult",
    "Task",
    "TaskMixture",
    "TokenizedEpisode",
    "UnknownEnvironmentError",
    "context_ids",
    "evaluate",
    "make",
    "names",
    "register",
    "run_episode",
    "spawn_environment",
    "tokenize_episode",
]
