"""The README's picture is what `render_overlap` draws, and its usage examples run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from dtensor_reshard import Layout, plan, render_overlap
from torch.distributed.tensor import Shard

README = (Path(__file__).parent.parent / "README.md").read_text()


def _usage_blocks() -> list[str]:
    usage = README.split("## Usage", 1)[1].split("\n## ")[0]
    return re.findall(r"```python\n(.*?)```", usage, re.S)


def test_readme_picture_is_render_overlap_output() -> None:
    block = re.search(r"<!-- overlap-picture:.*?-->\n```text\n(.*?)```", README, re.S)
    assert block is not None
    src = Layout((9, 6), torch.float32, (2, 2), (Shard(0), Shard(1)))
    dst = Layout((9, 6), torch.float32, (4,), (Shard(0),))
    assert block.group(1).rstrip("\n") == render_overlap(plan(src, dst))


@pytest.mark.slow  # Monarch processes
def test_readme_versioned_sync_example_runs_as_a_script(tmp_path: Path) -> None:
    script = tmp_path / "usage.py"
    script.write_text(_usage_blocks()[0])
    run = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "version 2, weight sum 48.0" in run.stdout, run.stdout + run.stderr[-3000:]


def test_readme_plan_example_runs() -> None:
    example = _usage_blocks()[1]
    assert "pull_plan" in example
    exec(compile(example, "README.md", "exec"), {"__name__": "readme"})
