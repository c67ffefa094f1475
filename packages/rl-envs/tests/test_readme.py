"""The README's usage examples run as written (each ```python block, in a fresh namespace)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from rl_envs import Sandbox

README = Path(__file__).resolve().parent.parent / "README.md"
pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not README.exists(), reason=f"no README at {README}: tests run outside a source checkout"
    ),
]


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def run_block(index: int) -> None:
    code = python_blocks()[index]
    exec(compile(code, f"{README}:python block {index}", "exec"), {"__name__": "readme"})


def test_readme_has_three_examples() -> None:
    assert len(python_blocks()) == 3


def test_local_episode_example(capsys: pytest.CaptureFixture[str]) -> None:
    run_block(0)
    assert "return 1.0 done True" in capsys.readouterr().out


def test_service_example(capsys: pytest.CaptureFixture[str]) -> None:
    run_block(1)
    assert "[1.0, 1.0, 1.0, 1.0] dropped: 0" in capsys.readouterr().out


def test_sandbox_example(sandbox: Sandbox, capsys: pytest.CaptureFixture[str]) -> None:
    run_block(2)
    assert capsys.readouterr().out == "6\n 0 exited\n"
