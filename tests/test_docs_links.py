"""The docs' relative links resolve, and docs/ holds prose: result files live in results/."""

from __future__ import annotations

import re

import pytest

from helpers import ROOT

LINK = re.compile(r"\]\(([^)\s]+)\)")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "results" / "README.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a web address or an anchor in the page
        path = target.split("#", 1)[0]
        if not (page.parent / path).exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)} links to missing files: {broken}"


def test_no_result_files_under_docs():
    dumps = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.json"))
    assert not dumps, f"result files belong in results/: {dumps}"
