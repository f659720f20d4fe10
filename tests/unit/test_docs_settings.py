"""docs/settings.md lists every setting the daemon reads, and no setting it does not: the
table is where a newcomer looks, so a new field without a row (or a row left behind by a
removed one) fails here."""

from __future__ import annotations

import re
from pathlib import Path

from ratewarden.service.settings import Settings
from ratewarden.vocabulary import ClientSettings

PAGE = Path(__file__).resolve().parents[2] / "docs" / "settings.md"


def documented(section: str) -> set[str]:
    """The names in the first cells of the table under the heading `section`."""
    names: set[str] = set()
    text = PAGE.read_text().split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    for line in text.splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            names.update(re.findall(r"`([A-Z][A-Z0-9_]*)`", first_cell))
    return names


def test_every_setting_has_a_row_and_every_row_a_setting() -> None:
    declared = {name.upper() for name in Settings.model_fields}
    assert documented("The settings") == declared


def test_every_client_setting_has_a_row_and_every_row_a_setting() -> None:
    read = {name.removesuffix("_text").upper() for name in ClientSettings._fields}
    assert documented("The clients' settings") == read
