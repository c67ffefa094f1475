"""The README's picture is what `render_overlap` draws, and its usage example runs."""

from __future__ import annotations

import re
from pathlib import Path

import torch
from dtensor_reshard import Layout, plan, render_overlap
from torch.distributed.tensor import Shard

README = (Path(__file__).parent.parent / "README.md").read_text()


def test_readme_picture_is_render_overlap_output() -> None:
    block = re.search(r"<!-- overlap-picture:.*?-->\n```text\n(.*?)```", README, re.S)
    assert block is not None
    src = Layout((9, 6), torch.float32, (2, 2), (Shard(0), Shard(1)))
    dst = Layout((9, 6), torch.float32, (4,), (Shard(0),))
    assert block.group(1).rstrip("\n") == render_overlap(plan(src, dst))


def test_readme_usage_example_runs() -> None:
    example = README.split("## Usage", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(example, "README.md", "exec"), {"__name__": "readme"})
