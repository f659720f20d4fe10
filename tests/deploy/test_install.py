"""Installs as a fresh machine makes them (docs/install.md), each into a new venv.

- `pip install .` (no extra), as a host installs the client: none of the daemon's packages
  arrive; the client, every adapter and hook module import; `ratewarden check` and
  `ratewarden hook claude-code` work against a real daemon; `ratewarden serve` (and
  `ratewarden mcp`) say in one line which extra to install.
- The wheel `python -m build --wheel` makes, installed with the `daemon` extra: `ratewarden
  serve` runs.

Each downloads its dependencies (from PyPI, or the index pip is configured with) and
builds in an isolated environment: minutes, hence `slow`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.daemon import clean_environment
from tests.helpers.hostenv import running_daemon

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# Distributions only the daemon (or the mcp extra) brings; none may reach a host.
DAEMON_ONLY = [
    "fastapi", "starlette", "uvicorn", "redis", "hiredis", "pydantic-settings",
    "prometheus-client", "pyyaml", "google-re2", "fastapi-offline", "mcp", "uvloop",
]  # fmt: skip
BASH_ONCE = """\
version: 1
rules:
  - name: terminal-once
    match: {tool: [terminal, Bash]}
    per: [user]
    rate: 1/minute
"""


def run(
    *command: str | Path, input: str | None = None, stdin: int | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(part) for part in command], input=input, stdin=stdin, env=clean_environment(),
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


def ok(*command: str | Path) -> subprocess.CompletedProcess[str]:
    done = run(*command)
    assert done.returncode == 0, f"{command}:\n{done.stdout}\n{done.stderr}"
    return done


def fresh_venv(path: Path) -> Path:
    ok(sys.executable, "-m", "venv", path)
    return path / "bin"


def checkout(tmp_path: Path) -> Path:
    """The files a clone has that an install reads, outside this working tree (a build
    writes into the tree it builds)."""
    source = tmp_path / "ratewarden"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    return source


def test_a_host_install_holds_the_client_and_not_the_daemon(tmp_path: Path) -> None:
    bin_ = fresh_venv(tmp_path / "host")
    ok(bin_ / "pip", "install", "-q", checkout(tmp_path))
    listed = json.loads(ok(bin_ / "pip", "list", "--format", "json").stdout)
    installed = {item["name"].lower().replace("_", "-") for item in listed}
    assert not installed & set(DAEMON_ONLY), installed & set(DAEMON_ONLY)
    imports = """
import pkgutil, sys, ratewarden, ratewarden.hooks, ratewarden.integrations
from ratewarden.client import AsyncClient, AsyncGuard, Client, Guard
from ratewarden.http import keepalive
from ratewarden.wire import bodies, bounded, names
for package in (ratewarden.hooks, ratewarden.integrations):
    for module in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        __import__(module.name)
print(sorted(name for name in ("fastapi", "starlette", "uvicorn", "redis", "yaml")
             if name in sys.modules))
"""
    assert ok(bin_ / "python", "-c", imports).stdout.strip() == "[]"

    with running_daemon(BASH_ONCE, tmp_path / "daemon") as daemon:
        flags = ("--url", daemon.url, "--user", "ana")
        check = run(bin_ / "ratewarden", "check", "--tool", "terminal", *flags)
        assert (check.returncode, check.stderr) == (0, "")
        payload = json.dumps(
            {"session_id": "s", "hook_event_name": "PreToolUse", "tool_name": "Bash",
             "tool_input": {"command": "ls"}, "tool_use_id": "toolu_1"}
        )  # fmt: skip
        hook = run(bin_ / "ratewarden", "hook", "claude-code", *flags, input=payload)
        assert hook.returncode == 0, hook.stderr
        decision = json.loads(hook.stdout)["hookSpecificOutput"]["permissionDecision"]
        assert decision == "deny"  # the rule's second call this minute: the daemon said so

    serve = run(bin_ / "ratewarden", "serve")
    assert serve.returncode == 2
    assert serve.stderr.strip().splitlines() == [
        "ratewarden: serve needs the daemon's dependencies (no module 'fastapi'): "
        "pip install 'ratewarden[daemon]' (from a clone: pip install '.[daemon]')"
    ]
    mcp = run(bin_ / "ratewarden", "mcp", "--user", "u", "--", "cat", stdin=subprocess.DEVNULL)
    assert mcp.returncode == 2
    assert "pip install 'ratewarden[mcp]'" in mcp.stderr
    assert "Traceback" not in mcp.stderr


def test_the_built_wheel_with_the_daemon_extra_serves(tmp_path: Path) -> None:
    source = checkout(tmp_path)
    ok(sys.executable, "-m", "build", "--wheel", "--outdir", tmp_path / "dist", source)
    (wheel,) = (tmp_path / "dist").glob("ratewarden-*.whl")
    bin_ = fresh_venv(tmp_path / "daemon")
    ok(bin_ / "pip", "install", "-q", f"{wheel}[daemon]")
    assert "--store-url" in ok(bin_ / "ratewarden", "serve", "--help").stdout
    example = source / "src" / "ratewarden" / "policy" / "example.yaml"
    assert ok(bin_ / "ratewarden", "policy", "check", example).stdout.startswith(f"{example}: ok")
