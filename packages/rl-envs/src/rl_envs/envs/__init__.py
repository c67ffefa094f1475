"""The built-in environments: two multi-turn word games and a tool-use task."""

from rl_envs.envs.calculator import Calculator
from rl_envs.envs.pattern import FollowThePattern
from rl_envs.envs.repeat import RepeatAfterMe

__all__ = ["Calculator", "FollowThePattern", "RepeatAfterMe"]
