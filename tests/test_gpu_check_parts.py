"""`tools/gpu_check.sh` refuses a part list it cannot run, at once and with exit status 2:
a part that does not exist, or parts without `setup` (which installs what they import; a
device call that ran `app` alone failed in a second on the GPU machine), before it empties
its scratch directory or writes anything."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def check(parts: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPU_CHECK_PARTS": parts, "GPU_CHECK_WORK": str(tmp_path / "work")}
    cmd = ["bash", str(ROOT / "tools" / "gpu_check.sh"), str(tmp_path / "out")]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(
    ("parts", "message"),
    [
        ("setup apps", "no part 'apps'"),
        ("app", "has no setup"),
        ("gpu_tests weight_sync", "has no setup"),
        ("async_vs_sync", "has no setup"),  # a part, though not a default one
    ],
)
def test_a_part_list_it_cannot_run_is_refused(parts: str, message: str, tmp_path: Path) -> None:
    earlier = tmp_path / "work" / "app" / "metrics.jsonl"  # a previous run's scratch
    earlier.parent.mkdir(parents=True)
    earlier.write_text("{}\n")
    done = check(parts, tmp_path)
    assert done.returncode == 2, done
    assert message in done.stderr, done.stderr
    assert earlier.read_text() == "{}\n"  # nothing emptied
    assert not (tmp_path / "out").exists()  # nothing written
