"""A sandbox for untrusted, model-written Python programs (bubblewrap), and the
`SandboxedPythonCoder` service that serves it. `python -m rl_envs.sandbox PROGRAM.py` runs
one program and prints the result as JSON."""

from rl_envs.sandbox._bwrap import SandboxUnavailableError
from rl_envs.sandbox.limits import ExecutionResult, SandboxLimits, StopReason
from rl_envs.sandbox.runner import Sandbox, SandboxError

__all__ = [
    "ExecutionResult",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxUnavailableError",
    "StopReason",
]
