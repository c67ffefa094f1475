"""Test setup shared by every test module.

Monarch finds a dead process by polling; the period is read from the environment when
`monarch` is first imported (default 10 s); 1 s makes the fault tests take seconds.

Sandbox tests need bubblewrap. Where it is missing they skip, naming the package; with
RL_ENVS_REQUIRE_SANDBOX=1 (set by the nox session once it has installed bubblewrap) they
fail instead, so CI cannot pass by skipping them.
"""

from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY", "1s")

# Test helpers (actors, the OpenEnv server) live beside this file.
sys.path.insert(0, os.path.dirname(__file__))

from rl_envs.sandbox import Sandbox, SandboxUnavailableError


def sandbox_or_skip() -> Sandbox:
    """A default `Sandbox`, or skip (fail under RL_ENVS_REQUIRE_SANDBOX=1) without one."""
    try:
        return Sandbox()
    except SandboxUnavailableError as e:
        if os.environ.get("RL_ENVS_REQUIRE_SANDBOX") == "1":
            pytest.fail(f"RL_ENVS_REQUIRE_SANDBOX=1 but the sandbox is unavailable: {e}")
        pytest.skip(f"needs the distribution package `bubblewrap` and user namespaces: {e}")


@pytest.fixture(scope="session")
def sandbox() -> Sandbox:
    return sandbox_or_skip()
