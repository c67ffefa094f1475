"""`SandboxedPythonCoder`: the sandbox as an actor-service service (the design documents'
code-execution service).

    coder = await spawn_service(SandboxedPythonCoder, ServiceConfig(replicas=4, name="coder"))
    result = await coder.endpoint(SandboxedPythonCoder.execute).route("print(6 * 7)")
    result.stdout, result.stderr, result.exit_code, result.stopped

A replica refuses to start where isolation is unavailable (`ReplicaStartError` carrying
`SandboxUnavailableError`'s message). Each call runs in a fresh sandbox, so `execute` is
idempotent: one in flight on a replica that dies is run again on another.
"""

from __future__ import annotations

from monarch.actor import Actor
from monarch.actor.concurrent import concurrent_endpoint

from rl_envs.sandbox.limits import ExecutionResult, SandboxLimits
from rl_envs.sandbox.runner import Sandbox


class SandboxedPythonCoder(Actor):
    """Runs untrusted Python programs, each in its own bubblewrap sandbox. Its endpoints
    are concurrent: a replica runs up to `ServiceConfig.max_in_flight_per_replica` programs
    at once (the default 2; the benchmark uses 4)."""

    def __init__(self, limits: SandboxLimits | None = None) -> None:
        self._sandbox = Sandbox(limits)

    @concurrent_endpoint
    async def execute(
        self, program: str, stdin: str = "", limits: SandboxLimits | None = None
    ) -> ExecutionResult:
        """Runs `program` with `stdin`; `limits` overrides the replica's for this call."""
        return await self._sandbox.arun(program, stdin=stdin, limits=limits)

    @concurrent_endpoint
    async def limits(self) -> SandboxLimits:
        return self._sandbox.limits
