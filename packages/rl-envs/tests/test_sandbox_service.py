"""The sandbox behind Monarch: the coder service, the calculator as an environment
service, and the command line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from actor_service import ServiceConfig, spawn_service
from policies import Oracle
from rl_envs import Sandbox, SandboxLimits, Task, run_episode, spawn_environment
from rl_envs.sandbox.service import SandboxedPythonCoder

pytestmark = pytest.mark.timeout(240)


async def test_coder_service_runs_programs_concurrently(sandbox: Sandbox) -> None:
    config = ServiceConfig(replicas=1, max_in_flight_per_replica=4, name="coder")
    async with await spawn_service(SandboxedPythonCoder, config) as coder:
        execute = coder.endpoint(SandboxedPythonCoder.execute)
        import asyncio  # noqa: PLC0415

        results = await asyncio.gather(*(execute.route(f"print({i} * {i})") for i in range(8)))
        assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(8)]
        assert all(r.ok and r.isolated for r in results)
        slow = await execute.route("while True: pass", "", SandboxLimits(cpu_seconds=1))
        assert slow.stopped == "cpu_limit"


async def test_calculator_as_a_service(sandbox: Sandbox) -> None:
    async with await spawn_environment("calculator") as env:
        record = await run_episode(Oracle(), env, Task("calculator", seed=9, level=2))
        assert record.ok
        assert record.reward == 1.0


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rl_envs.sandbox", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_command_line_prints_one_json_object(sandbox: Sandbox, tmp_path: Path) -> None:
    program = tmp_path / "program.py"
    program.write_text("import sys\nprint(input()[::-1])\nsys.exit(3)\n")
    stdin = tmp_path / "stdin.txt"
    stdin.write_text("olleh\n")
    done = run_cli(str(program), "--stdin", str(stdin), "--wall-seconds", "20")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["stdout"] == "hello\n"
    assert result["exit_code"] == 3
    assert result["stopped"] == "exited"
    assert result["isolated"] is True
    assert result["ok"] is False


def test_command_line_errors_name_the_problem(tmp_path: Path) -> None:
    program = tmp_path / "program.py"
    program.write_text("print(1)\n")
    bad = run_cli(str(program), "--memory-bytes", "0")
    assert bad.returncode == 2
    assert "SandboxLimits.memory_bytes must be > 0, got 0" in bad.stderr
    missing = run_cli(str(tmp_path / "missing.py"))
    assert missing.returncode == 2
    assert "No such file" in missing.stderr


def test_sandbox_argument_errors(sandbox: Sandbox) -> None:
    with pytest.raises(TypeError, match=r"program must be text \(str\), got bytes"):
        sandbox.run(b"print(1)")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"SandboxLimits\.wall_seconds must be > 0"):
        SandboxLimits(wall_seconds=-1)
    with pytest.raises(TypeError, match=r"SandboxLimits\.cpu_seconds must be an int"):
        SandboxLimits(cpu_seconds=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="limits must be a SandboxLimits"):
        sandbox.run("pass", limits={"cpu_seconds": 1})  # type: ignore[arg-type]


def test_unsafe_switch_is_loud_and_marks_results() -> None:
    with pytest.warns(RuntimeWarning, match="WITHOUT isolation"):
        unsafe = Sandbox(unsafe_no_isolation=True)
    result = unsafe.run("print('hi')")
    assert result.stdout == "hi\n"
    assert result.isolated is False


def test_output_cap_kills_a_chatty_program(sandbox: Sandbox) -> None:
    result = sandbox.run(
        "while True:\n    print('x' * 1000)\n", limits=SandboxLimits(output_bytes=10_000)
    )
    assert result.stopped == "output_limit"
    assert result.stdout_truncated
    assert len(result.stdout) == 10_000


def test_missing_bubblewrap_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from rl_envs.sandbox import SandboxUnavailableError, _bwrap  # noqa: PLC0415

    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda n: None if n == "bwrap" else real_which(n))
    _bwrap.find_runtime.cache_clear()
    try:
        with pytest.raises(SandboxUnavailableError, match="distribution package `bubblewrap`"):
            Sandbox()
    finally:
        _bwrap.find_runtime.cache_clear()
