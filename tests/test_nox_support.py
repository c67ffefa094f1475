"""`tools/nox_support.run_together`, which the default `uv run nox` leans on to run checks
side by side: commands run `width` at a time, the next one read only when a place is free
(so a generator can make each command's environment while the ones before it run), and a
failure or an overrun is reported by name."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from nox_support import run_together  # noqa: E402


def sleeper(done: Path, seconds: float, code: int = 0) -> list[str]:
    """A command that sleeps, then writes `done`, then exits with `code`."""
    script = (
        f"import sys, time; time.sleep({seconds}); "
        f"open({str(done)!r}, 'w').close(); sys.exit({code})"
    )
    return [sys.executable, "-c", script]


def lazily(tmp_path: Path, width: int) -> list[bool]:
    """Runs three sleepers `width` at a time from a generator; for each command after the
    first, whether the one before it had finished when the generator was asked for it."""
    tmp_path.mkdir()
    finished_before: list[bool] = []

    def commands() -> Iterator[list[str]]:
        for i in range(3):
            if i:
                finished_before.append((tmp_path / f"{i - 1}").exists())
            yield sleeper(tmp_path / f"{i}", 0.5)

    assert run_together(commands(), dict(os.environ), width=width, limit_s=60, log=print) == []
    return finished_before


def test_the_next_command_is_read_only_when_a_place_is_free(tmp_path: Path) -> None:
    assert lazily(tmp_path / "one", width=1) == [True, True]
    # Two places: the second command is read at once, the third when the first has ended.
    assert lazily(tmp_path / "two", width=2) == [False, True]


def test_failures_and_overruns_are_reported_by_name(tmp_path: Path) -> None:
    lines: list[str] = []
    commands = [
        sleeper(tmp_path / "ok", 0),
        sleeper(tmp_path / "fails", 0, code=3),
        sleeper(tmp_path / "slow", 30),
    ]
    failed = run_together(commands, dict(os.environ), width=3, limit_s=2.0, log=lines.append)
    assert len(failed) == 2, failed
    assert "fails" in failed[0]
    assert failed[0].endswith("exit status 3")
    assert "slow" in failed[1]
    assert failed[1].endswith("still running after 2 s, killed")
    assert not (tmp_path / "slow").exists()
    assert len(lines) == 3  # each command's status is logged, the one that passed too
