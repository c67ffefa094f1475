"""`help_runner.py`, which runs the docs' `--help` checks: each command line in a forked
process, its exit status and output reported in order, and a child that does not end within
`CHILD_LIMIT_S` killed and named instead of waited on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow  # the runner imports torch and transformers first


def test_results_in_order_and_a_stuck_child_killed(tmp_path: Path) -> None:
    stuck = tmp_path / "stuck.py"
    stuck.write_text("import time\ntime.sleep(60)\n")
    fails = tmp_path / "fails.py"
    fails.write_text("import sys\nprint('to stdout')\nsys.exit(3)\n")
    commands = [[str(stuck)], [str(fails), "--help"], ["-m", "json.tool", "--help"]]
    driver = (
        "import sys; sys.path.insert(0, 'tests'); import help_runner; "
        "help_runner.CHILD_LIMIT_S = 2.0; help_runner.main()"
    )
    args = [json.dumps(c) for c in commands]
    done = subprocess.run(
        [sys.executable, "-c", driver, *args],
        cwd=ROOT, capture_output=True, text=True, timeout=50, check=True,
    )  # fmt: skip
    killed, failed, helped = json.loads(done.stdout)
    assert killed["returncode"] == -9
    assert "killed, still running after 2 s" in killed["stderr"]
    assert (failed["returncode"], failed["stdout"]) == (3, "to stdout\n")
    assert helped["returncode"] == 0
    assert "usage:" in helped["stdout"]
