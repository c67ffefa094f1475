"""A sandboxed program's environment is an explicit minimal set: nothing of the host's
(its working directory, its variables) reaches the program or what it starts."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from rl_envs.sandbox import Sandbox

pytestmark = pytest.mark.timeout(120)

# Its own environment, then a child interpreter's (no -I there: it would read PYTHON*).
SHOW = """
import json, os, subprocess, sys
show = "import json, os; print(json.dumps(dict(os.environ)))"
child = subprocess.run([sys.executable, "-c", show], capture_output=True, text=True,
                       check=True).stdout
print(json.dumps([dict(os.environ), json.loads(child), os.getcwd()]))
"""


@pytest.fixture
def host_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The test's working directory moved to `tmp_path` (PWD with it, as a shell would set
    it), and a variable only the host has."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PWD", str(tmp_path))
    monkeypatch.setenv("RL_ENVS_HOST_ONLY", "host-value-5151")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return tmp_path


def test_the_sandbox_gets_only_its_own_variables(sandbox: Sandbox, host_environment: Path) -> None:
    result = sandbox.run(SHOW)
    assert result.ok, result
    own, child, cwd = json.loads(result.stdout)
    python_bin = os.path.dirname(os.path.realpath(sys.executable))
    expected = {"PATH": python_bin, "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
    assert own == expected
    assert child == expected
    assert cwd == "/tmp"
    assert str(host_environment) not in result.stdout


def test_without_isolation_the_environment_is_the_same_set(host_environment: Path) -> None:
    with pytest.warns(RuntimeWarning, match="WITHOUT isolation"):
        unsafe = Sandbox(unsafe_no_isolation=True)
    result = unsafe.run(SHOW)
    assert result.ok, result
    own, child, cwd = json.loads(result.stdout)
    python_bin = os.path.dirname(sys.executable)
    expected = {"PATH": python_bin, "HOME": cwd, "TMPDIR": cwd, "LANG": "C.UTF-8"}
    assert own == expected
    assert child == expected
    assert cwd != str(host_environment)
    assert "host-value-5151" not in result.stdout
