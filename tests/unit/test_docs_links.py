"""Every relative link in the README and the docs reaches a file that exists, and every
`#anchor` a heading of that file (GitHub's slugs), so moving a section cannot strand a
link to it. Standard library only; reads the Markdown, runs nothing."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    + [p for p in (ROOT / "CONTRIBUTING.md", ROOT / "CHANGELOG.md") if p.exists()]
)

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+).*?\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans taken out."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text, lower-cased, punctuation dropped, spaces
    made hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.lower()
    kept = []
    for char in text:
        if char in " -_" or unicodedata.category(char)[0] in "LN":
            kept.append(char)
    return "".join(kept).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose_lines(page.read_text()):
        heading = HEADING.match(line)
        if not heading:
            continue
        base = slug(heading.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[str]:
    targets = []
    for line in prose_lines(page.read_text()):
        targets.extend(LINK.findall(CODE_SPAN.sub("", line)))
    return targets


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {path}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_the_readme_links_every_docs_page() -> None:
    """A page the README does not reach is a page a newcomer never finds."""
    reached = {(ROOT / t.partition("#")[0]).resolve() for t in links(ROOT / "README.md")}
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p not in reached]
    assert unlinked == []


def test_the_slugs_are_githubs() -> None:
    assert slug("Who is asking: identity is a credential, not a claim") == (
        "who-is-asking-identity-is-a-credential-not-a-claim"
    )
    assert slug("`RATEWARDEN_MAX_CONNECTIONS` (default: derived, flag `--max-connections`)") == (
        "ratewarden_max_connections-default-derived-flag---max-connections"
    )
    assert slug("Annotations → metadata → policy") == "annotations--metadata--policy"
