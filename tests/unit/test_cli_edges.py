"""Commands whose optional extra is not installed: a sentence naming the extra, not a
traceback. `ratewarden mcp` needs the `mcp` extra, `serve` and `policy` the `daemon` one.

This environment has both, so a module is hidden here as if it were not installed
(`sys.modules[name] = None`: `find_spec` finds nothing, an import fails).
tests/deploy/test_install.py checks the same on a real install without the extras.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

RUN_HIDING = """
import sys
sys.modules[sys.argv[1]] = None
sys.argv = ["ratewarden", *sys.argv[2:]]
from ratewarden.__main__ import main
raise SystemExit(main())
"""


def run_without(module: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", RUN_HIDING, module, *argv],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("module", ["mcp", "yaml"])
def test_mcp_without_its_extra_says_which_extra_to_install(module: str) -> None:
    done = run_without(module, "mcp", "--user", "u", "--", "cat")
    assert done.returncode == 2
    assert "pip install 'ratewarden[mcp]'" in done.stderr
    assert f"no module {module!r}" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("module", "argv"),
    [
        ("fastapi", ["serve"]),
        ("redis", ["serve", "--port", "1"]),
        ("yaml", ["policy", "check", "nowhere.yaml"]),
        ("re2", ["policy", "explain", "nowhere.yaml", "--user", "u", "--tool", "t"]),
    ],
)
def test_daemon_commands_without_the_daemon_extra_say_which_to_install(
    module: str, argv: list[str]
) -> None:
    done = run_without(module, *argv)
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()  # one line
    assert "pip install 'ratewarden[daemon]'" in line
    assert "pip install '.[daemon]'" in line
    assert f"no module {module!r}" in line
