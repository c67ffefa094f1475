"""The README's usage example, run as a reader would run it: as a script of its own."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"


@pytest.mark.slow  # Monarch processes
def test_usage_example_runs_and_syncs_the_weights(tmp_path: Path) -> None:
    text = README.read_text()
    usage = text[text.index("## Usage") :]
    code = re.search(r"```python\n(.*?)```", usage, re.S)
    assert code is not None, "README has no python block under ## Usage"
    script = tmp_path / "usage.py"
    script.write_text(code.group(1))
    run = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "generator weight sum: 12288.0, mapped: True" in run.stdout, (
        run.stdout + run.stderr[-3000:]
    )
