"""The README's usage examples run as written (each ```python block, in a fresh namespace)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks() -> list[str]:
    if not README.exists():
        return []
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


@pytest.mark.skipif(
    not README.exists(), reason=f"no README at {README}: tests run outside a source checkout"
)
def test_readme_has_usage_examples() -> None:
    assert len(python_blocks()) >= 2


@pytest.mark.skipif(
    not README.exists(), reason=f"no README at {README}: tests run outside a source checkout"
)
@pytest.mark.parametrize("index", range(2))
def test_readme_example_runs(index: int) -> None:
    code = python_blocks()[index]
    exec(compile(code, f"{README}:python block {index}", "exec"), {"__name__": "readme"})
