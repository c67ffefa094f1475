"""The report in a real browser: headless Chromium (Debian's `chromium`) driven by
Playwright, with every network request refused, so the page must work offline.

The test opens a sweep report, reads the numbers the page shows, moves the slider with the
keyboard as a reader would, and checks that the displayed busy shares and throughput change
to exactly what the recorded runs say; it saves a screenshot.

Playwright cannot download its own browsers here, so it drives the system Chromium
(`/usr/bin/chromium`, or `ASYNC_GRPO_CHROMIUM`). Without Playwright (`uv sync --group
browser`) or Chromium (`apt-get install chromium`) the test skips, saying which is missing;
with `ASYNC_GRPO_REQUIRE_BROWSER=1` (the `browser` nox session, so CI) it fails instead.
`ASYNC_GRPO_SCREENSHOT_DIR` keeps the screenshots.

Also a script, for chapter 06's pictures of a real sweep (`--position K`: the slider at
the sweep's K-th run):

    PYTHONPATH=apps/async_grpo/tests uv run --group browser python \\
        apps/async_grpo/tests/observability/test_report_browser.py \\
        runs/sweep/report.html apps/async_grpo/docs/sweep_age0.png --position 0
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from async_grpo.observability.report.build import summarize, write_report
from async_grpo.observability.report.run_dir import load_run
from synthetic_runs import write_sweep

CHROMIUM = Path(os.environ.get("ASYNC_GRPO_CHROMIUM", "/usr/bin/chromium"))
STATS = (
    "generator_busy",
    "trainer_busy",
    "episodes_per_s",
    "trained_share",
    "staleness_mean",
    "reward_final",
)


def _missing(why: str) -> None:
    if os.environ.get("ASYNC_GRPO_REQUIRE_BROWSER") == "1":
        pytest.fail(why)
    pytest.skip(why)


def _playwright() -> Any:
    try:
        return importlib.import_module("playwright.sync_api")
    except ImportError:
        _missing("Playwright is not installed: `uv sync --group browser`")
    raise AssertionError("unreachable")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    api = _playwright()
    if not CHROMIUM.exists():
        _missing(f"no Chromium at {CHROMIUM}: install the Debian package `chromium`")
    with api.sync_playwright() as p:
        args = ["--no-sandbox"] if os.geteuid() == 0 else []
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=args, headless=True)
        yield b
        b.close()


def open_offline(browser: Any, report: Path) -> tuple[Any, list[str], list[str]]:
    """A page with `report` loaded and drawn; every non-file request is refused and
    recorded. Returns (page, refused requests, page errors)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    refused: list[str] = []
    errors: list[str] = []

    def route(r: Any) -> None:
        if r.request.url.startswith("file:"):
            r.continue_()
        else:
            refused.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(report.resolve().as_uri())
    page.wait_for_selector('body[data-ready="1"]', timeout=30_000)
    return page, refused, errors


def shown(page: Any) -> dict[str, tuple[float, str]]:
    """The numbers on the page: raw value and displayed text, by key."""
    out = {}
    for key in STATS:
        el = page.locator(f"#stat-{key}")
        out[key] = (float(el.get_attribute("data-value")), el.inner_text())
    return out


def move(page: Any, key: str) -> int:
    """Presses `key` on the focused slider; returns the run index the page then shows."""
    page.locator("#run-slider").focus()
    page.keyboard.press(key)
    selected = page.locator("#run-slider").input_value()
    page.wait_for_selector(f'body[data-ready="1"][data-selected="{selected}"]', timeout=30_000)
    return int(selected)


def save(page: Any, name: str, tmp_path: Path) -> Path:
    keep = os.environ.get("ASYNC_GRPO_SCREENSHOT_DIR")
    out = (Path(keep) if keep else tmp_path) / name
    out.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out), full_page=True)
    return out


def test_slider_moves_between_the_recorded_runs(browser: Any, tmp_path: Path) -> None:
    sweep = write_sweep(tmp_path / "sweep")
    report = write_report(sweep)
    expected = [summarize(load_run(sweep / f"age-{a}")) for a in (0, 1, 2, 4)]
    page, refused, errors = open_offline(browser, report)

    first = shown(page)
    for key in STATS:
        assert first[key][0] == pytest.approx(expected[0][key]), key
    assert first["generator_busy"][1] == f"{expected[0]['generator_busy']:.0%}"
    assert page.locator("#run-label").inner_text() == "max_policy_age 0 (sync)"
    bars = page.locator("#fig-timeline g.point").count()
    assert bars > 20, "the timeline drew no spans"

    assert move(page, "ArrowRight") == 1
    second = shown(page)
    for key in STATS:
        assert second[key][0] == pytest.approx(expected[1][key]), key
    # As the recorded runs say: off sync, both sides busier and more episodes per second.
    assert second["generator_busy"][0] > first["generator_busy"][0]
    assert second["trainer_busy"][0] > first["trainer_busy"][0]
    assert second["episodes_per_s"][0] > first["episodes_per_s"][0]
    assert second["episodes_per_s"][1] != first["episodes_per_s"][1]
    assert page.locator("#run-label").inner_text() == "max_policy_age 1"

    assert move(page, "End") == 3
    last = shown(page)
    assert last["staleness_mean"][0] == pytest.approx(expected[3]["staleness_mean"])
    assert last["reward_final"][0] < first["reward_final"][0]
    png = save(page, "sweep_report.png", tmp_path)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 20_000
    assert not refused, f"the page asked the network for {refused}"
    assert not errors, errors


def test_cut_short_run_shows_a_banner(browser: Any, tmp_path: Path) -> None:
    sweep = write_sweep(tmp_path / "sweep", ages=(1,))
    run_dir = sweep / "age-1"
    (run_dir / "trace.json").unlink()
    ctrl = next((run_dir / "trace").glob("controller-*.jsonl"))
    ctrl.write_text("".join(ctrl.read_text().splitlines(keepends=True)[:-1]))
    page, refused, errors = open_offline(browser, write_report(run_dir))
    banner = page.locator("#banner")
    assert banner.is_visible()
    assert "cut short" in banner.inner_text()
    assert not page.locator("#slider-box").is_visible()  # one run: no slider
    assert page.locator("#fig-utilization .main-svg").count() > 0
    assert not refused
    assert not errors, errors


def screenshot(report: Path, out: Path, position: int, width: int = 1200) -> None:
    """Saves the top of `report` (slider, numbers, trade-off, timeline) with the slider at
    `position` (a sweep's page; one run's page has no slider), as a PNG at `out`."""
    api = _playwright()
    with api.sync_playwright() as p:
        args = ["--no-sandbox"] if os.geteuid() == 0 else []
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=args, headless=True)
        page = b.new_page(viewport={"width": width, "height": 900})
        page.goto(report.resolve().as_uri())
        page.wait_for_selector('body[data-ready="1"]', timeout=30_000)
        if page.locator("#slider-box").is_visible():  # a sweep; one run's page has none
            page.locator("#run-slider").evaluate(
                "(el, k) => { el.value = k; el.dispatchEvent(new Event('input')); }", position
            )
            page.wait_for_selector(f'body[data-ready="1"][data-selected="{position}"]')
        bottom = page.locator("#fig-timeline").bounding_box()
        page.screenshot(
            path=str(out),
            full_page=True,
            clip={"x": 0, "y": 0, "width": width, "height": bottom["y"] + bottom["height"]},
        )
        b.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Screenshot of a report, slider at a position")
    parser.add_argument("report", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--position", type=int, default=0)
    a = parser.parse_args()
    if shutil.which(str(CHROMIUM)) is None:
        raise SystemExit(f"no Chromium at {CHROMIUM}: apt-get install chromium")
    screenshot(a.report, a.out, a.position)
    print(a.out)
