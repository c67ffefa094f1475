"""The README's usage example runs as a script, as a reader would run it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs(tmp_path: Path) -> None:
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    assert block is not None
    script = tmp_path / "example.py"
    script.write_text(block.group(1))
    env = {**os.environ, "HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY": "1s"}
    run = subprocess.run(
        [sys.executable, str(script)],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0] == "hello world (policy v0)"
    assert lines[1] == "[1, 1]"
    assert lines[2:4] == ["hello hi (policy v1)", "hello again (policy v1)"]
    assert "service policy: 2/2 healthy" in lines[4]
