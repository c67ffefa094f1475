"""Every relative link in the project's Markdown points at a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from quoted_commands import ROOT, markdown_files

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("doc", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path) -> None:
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.DOTALL)  # code is not links
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # external URL or in-page anchor
        path = target.split("#", 1)[0]
        if not (doc.parent / path).exists():
            broken.append(target)
    assert not broken, f"{doc.relative_to(ROOT)} links to missing files: {broken}"
