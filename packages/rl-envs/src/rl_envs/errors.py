"""Errors of the environment contract. Each takes a single message, so it pickles and
crosses actor boundaries intact (a service's caller finds it as `ActorError.exception`)."""

from __future__ import annotations


class EnvError(Exception):
    """Base class of this package's environment errors."""


class UnknownEnvironmentError(EnvError, KeyError):
    """No environment is registered under that name (the message lists the known ones)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ActionTypeError(EnvError, TypeError):
    """`step` was given something other than an `Action`."""


class EpisodeNotStartedError(EnvError):
    """`step` (or `state`) before any `reset`."""


class EpisodeDoneError(EnvError):
    """`step` after the episode ended (`done` was True); call `reset` for a new one."""


class EpisodeLostError(EnvError):
    """A replica was asked about an episode it does not hold: the replica that held it died
    (its replacement starts empty) or the episode was closed."""
