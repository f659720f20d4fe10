"""The habits a commit is held to: scripts/commit-msg.

The message check runs as git runs it (the script, the message file as its argument).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMIT_MSG = ROOT / "scripts" / "commit-msg"


def check_message(tmp_path: Path, message: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "COMMIT_EDITMSG"
    path.write_text(message, encoding="utf-8")
    return subprocess.run(
        [sys.executable, str(COMMIT_MSG), str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize(
    "message",
    [
        "Relax regular expression for parsing limits\n\nThe why, and the figures.\n",
        "x" * 72 + "\n",
        "\n# Please enter the commit message for your changes.\nAdd a line\n",
    ],
    ids=["with-body", "72-characters", "after-comments"],
)
def test_a_subject_of_at_most_72_characters_passes(tmp_path: Path, message: str) -> None:
    result = check_message(tmp_path, message)
    assert (result.returncode, result.stderr) == (0, "")


def test_a_subject_over_72_characters_is_refused(tmp_path: Path) -> None:
    result = check_message(tmp_path, "x" * 73 + "\n\nA body does not help.\n")
    assert result.returncode == 1
    assert "73 characters, at most 72" in result.stderr


def test_an_empty_subject_is_refused(tmp_path: Path) -> None:
    result = check_message(tmp_path, "\n# only a comment\n\n")
    assert result.returncode == 1
    assert "no subject" in result.stderr
