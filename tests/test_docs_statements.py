"""Statements several pages make must say the same thing, word for word.

Where the project has run is said on the front page, in the app's README, in the
chapters about the whole loop and about several machines, and on the practitioner's
page. A reader who finds it in one place must find the same sentence in the others, so
a change to where it has run (a first GPU run, say) is made everywhere at once: this
test fails until it is.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

WHERE_IT_HAS_RUN = (
    "Where this has run: Linux x86-64 machines without a GPU, 2 CPU cores each, and twice, for "
    "`tools/gpu_check.sh` (its GPU tests, the weight-sync benchmark and a one-minute run of the "
    "app with the HF engine), one NVIDIA H200 (2026-11-27). It has never run on more than one "
    "GPU, with vLLM on a GPU, on more than one machine, or over ibverbs RDMA."
)
PAGES = [
    "README.md",
    "apps/async_grpo/README.md",
    "docs/05_async_rl.md",
    "docs/08_scaling_out.md",
    "docs/practitioner.md",
]


def _words(text: str) -> str:
    """The text with every run of whitespace one space: Markdown wraps lines anywhere."""
    return " ".join(text.split())


@pytest.mark.parametrize("page", PAGES)
def test_where_it_has_run_is_stated_word_for_word(page: str) -> None:
    text = _words((ROOT / page).read_text())
    assert _words(WHERE_IT_HAS_RUN) in text, (
        f"{page} must state, word for word (line breaks aside): {WHERE_IT_HAS_RUN}"
    )


def test_the_statement_is_made_once_per_page() -> None:
    """Once each: a second, edited copy on the same page would contradict the first."""
    counts = {p: _words((ROOT / p).read_text()).count("Where this has run:") for p in PAGES}
    assert counts == dict.fromkeys(PAGES, 1), counts
