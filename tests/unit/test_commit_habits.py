"""The habits a commit is held to: scripts/commit-msg and .pre-commit-config.yaml.

The message check runs as git runs it (the script, the message file as its argument);
the config is read as pre-commit reads it, and must name CI's checks as local hooks on
the project's own tools, so installing the hooks fetches nothing.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMMIT_MSG = ROOT / "scripts" / "commit-msg"
CONFIG = ROOT / ".pre-commit-config.yaml"


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


def hooks() -> dict[str, dict[str, Any]]:
    config = yaml.safe_load(CONFIG.read_text())
    assert [repo["repo"] for repo in config["repos"]] == ["local"]  # nothing to fetch
    return {hook["id"]: hook for repo in config["repos"] for hook in repo["hooks"]}


def test_the_config_runs_ci_checks_and_the_message_check() -> None:
    found = hooks()
    assert set(found) == {"ruff-format", "ruff-check", "mypy", "commit-msg"}
    assert found["ruff-format"]["entry"].startswith(".venv/bin/ruff format")
    assert found["ruff-check"]["entry"].startswith(".venv/bin/ruff check")
    assert found["mypy"]["entry"] == ".venv/bin/mypy"  # pyproject's files, as CI
    assert found["mypy"]["pass_filenames"] is False
    assert found["commit-msg"]["entry"] == "scripts/commit-msg"
    assert found["commit-msg"]["stages"] == ["commit-msg"]
    config = yaml.safe_load(CONFIG.read_text())
    assert set(config["default_install_hook_types"]) == {"pre-commit", "commit-msg"}


def test_pre_commit_accepts_the_config() -> None:
    pre_commit = shutil.which("pre-commit", path=str(Path(sys.executable).parent))
    if pre_commit is None:
        pytest.skip("pre-commit is not installed beside this python")
    result = subprocess.run(
        [pre_commit, "validate-config", str(CONFIG)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
