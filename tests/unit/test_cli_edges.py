"""`ratewarden mcp` where the MCP SDK is not installed (this environment has none: it is
the `mcp` extra): a sentence naming the extra, not a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

RATEWARDEN = Path(sys.executable).with_name("ratewarden")


def test_mcp_without_the_sdk_says_which_extra_to_install() -> None:
    done = subprocess.run(
        [str(RATEWARDEN), "mcp", "--user", "u", "--", "cat"],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "pip install 'ratewarden[mcp]'" in done.stderr
    assert "Traceback" not in done.stderr
