"""The course (README.md, docs/, examples/) keeps one reading order and fits about three hours.

The length is measured by `docs/pacing.py` from the files themselves; these tests fail when an
edit makes the walk-through drift past about three hours, when README.md stops quoting the
measured length, or when a chapter or example falls out of the one reading order.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
ABOUT_THREE_HOURS_MIN = 195  # "about three hours": three hours and a quarter at most


def _pacing() -> Any:
    spec = importlib.util.spec_from_file_location("pacing", ROOT / "docs" / "pacing.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["pacing"] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


def _readme() -> str:
    return (ROOT / "README.md").read_text()


def test_the_walkthrough_fits_about_three_hours() -> None:
    minutes = _pacing().total_minutes()
    assert minutes <= ABOUT_THREE_HOURS_MIN, (
        f"the walk-through measures {minutes:.0f} min (uv run python docs/pacing.py); cut "
        f"prose or example lines to get back under {ABOUT_THREE_HOURS_MIN}"
    )


def test_readme_quotes_the_measured_length() -> None:
    minutes = _pacing().total_minutes()
    quoted = re.search(r"measures about (\d+) minutes", _readme())
    assert quoted, "README.md should say 'measures about N minutes' (docs/pacing.py's total)"
    assert abs(int(quoted.group(1)) - minutes) <= 5, (
        f"README.md quotes {quoted.group(1)} minutes, docs/pacing.py measures {minutes:.0f}"
    )


def test_readme_quotes_the_further_chapters_minutes() -> None:
    minutes = _pacing().further_minutes()
    quoted = re.search(r"measured the same way \(about (\d+)\s+minutes", _readme())
    assert quoted, "README.md should give the further chapters' minutes (docs/pacing.py)"
    assert abs(int(quoted.group(1)) - minutes) <= 5, (
        f"README.md quotes {quoted.group(1)} minutes for the further chapters, "
        f"docs/pacing.py measures {minutes:.0f}"
    )


def test_readme_table_quotes_each_steps_minutes() -> None:
    """Each row of README.md's reading-order table ends with the minutes docs/pacing.py
    measures for the step that reads that chapter."""
    pacing = _pacing()
    rows = re.findall(r"^\| \d \| \[(docs/\d\d_\w+\.md)\].*\| (\d+) \|$", _readme(), flags=re.M)
    assert len(rows) == 6, f"expected six reading-order rows in README.md, found {rows}"
    for chapter, quoted in rows:
        (step,) = [s for s in pacing.STEPS if chapter in s.read]
        measured = pacing.count_step(step).minutes
        assert abs(int(quoted) - measured) <= 2, (
            f"{chapter}: README {quoted}, measured {measured:.0f}"
        )


def test_every_chapter_and_example_is_in_the_measured_walkthrough() -> None:
    pacing = _pacing()
    steps = [*pacing.STEPS, *pacing.FURTHER]
    measured = {p for step in steps for p in [*step.read, *step.examples]}
    chapters = {f"docs/{p.name}" for p in (ROOT / "docs").glob("[0-9][0-9]_*.md")}
    examples = {f"examples/{p.name}" for p in (ROOT / "examples").glob("[0-9][0-9]_*.py")}
    assert chapters | examples <= measured, sorted((chapters | examples) - measured)
    assert all((ROOT / p).is_file() for p in measured), [
        p for p in measured if not (ROOT / p).is_file()
    ]


@pytest.mark.parametrize("doc", ["README.md", "examples/README.md"])
def test_one_reading_order(doc: str) -> None:
    """Chapters and examples appear in ascending order, so both files give the same order."""
    text = (ROOT / doc).read_text()
    chapters = [int(n) for n in re.findall(r"docs/(\d\d)_\w+\.md", text)]
    examples = [int(n) for n in re.findall(r"\b(\d\d)_\w+\.py", text)]
    assert chapters == sorted(chapters), f"{doc}: chapters out of order: {chapters}"
    assert examples == sorted(examples), f"{doc}: examples out of order: {examples}"


@pytest.mark.parametrize(
    "doc",
    [
        "README.md",
        "examples/README.md",
        *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")),
        *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("packages/*/README.md")),
        *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("apps/*/README.md")),
        *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("apps/*/docs/*.md")),
    ],
)
def test_docs_speak_to_users(doc: str) -> None:
    """No wording from the project's own planning (goals, issues, requests) in user docs."""
    text = (ROOT / doc).read_text()
    found = re.findall(r"\bgoals?\b|\bissue \d+|\bwas asked for\b", text, flags=re.I)
    assert not found, f"{doc}: {found}"
