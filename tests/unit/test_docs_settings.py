"""docs/settings.md lists every setting the daemon reads, and no setting it does not: the
table is where a newcomer looks, so a new field without a row (or a row left behind by a
removed one) fails here."""

from __future__ import annotations

import re
from pathlib import Path

from ratewarden.service.settings import Settings

PAGE = Path(__file__).resolve().parents[2] / "docs" / "settings.md"


def documented() -> set[str]:
    names: set[str] = set()
    for line in PAGE.read_text().splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            names.update(re.findall(r"`([A-Z][A-Z0-9_]*)`", first_cell))
    return names


def test_every_setting_has_a_row_and_every_row_a_setting() -> None:
    declared = {name.upper() for name in Settings.model_fields}
    assert documented() == declared
