"""wire/tools.py's table against the installed hosts: each host tool name in it, and each
argument it renames, is read here out of the host's own package files (the builds of
tests/helpers/hostenv.py under .hosts/), so the table cannot drift from a host upgrade
unnoticed. A host whose environment is not built is skipped, saying so: these tests read
the files and do not build them (the real-host tests do).

Cursor and agent-code have no package among the host environments (Cursor's runtime
needs its backend; agent-code's crates are not fetchable here): their rows are read from
@cursor/sdk 1.0.32 and avala-ai/agent-code 0.30.0, as docs/integrations.md says.
"""

from __future__ import annotations

import mmap
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from ratewarden.wire.tools import HOST_TOOLS
from tests.helpers.hostenv import HOSTS_DIR, pins

CLAUDE_BUNDLE = "claude_agent_sdk/_bundled/claude"
CODEX_BINARY = "@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex"
GEMINI_BUNDLE = "@google/gemini-cli/bundle"


def _site_packages(env: str) -> Path:
    found = sorted((HOSTS_DIR / env / "lib").glob("python3*/site-packages"))
    if not found:
        pytest.skip(f"the {env} host environment is not built (.hosts/{env}): run its host test")
    return found[0]


def _file(path: Path, what: str) -> Path:
    if not path.is_file():
        pytest.skip(f"{what} is not installed ({path}): run its host test to build it")
    return path


def _contains(path: Path, *needles: bytes) -> dict[bytes, bool]:
    """Which of `needles` occur in the (large, binary) file at `path`."""
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        return {needle: m.find(needle) >= 0 for needle in needles}


def _renamed_keys(host: str) -> Iterator[tuple[str, str]]:
    for name, row in HOST_TOOLS[host].items():
        for theirs in row.args:
            yield name, theirs


def test_claude_code_rows_are_the_bundled_clis_tool_names() -> None:
    cli = _file(_site_packages("claude_code") / CLAUDE_BUNDLE, "Claude Code's bundled CLI")
    assert any("claude-agent-sdk==" in pin for pin in pins("claude_code"))
    # Each tool's name is a string constant of the bundle (`var ke="Bash"`), and each
    # renamed argument a key of a tool's input schema (`xe({file_path:r()...`).
    names = {name: f'="{name}"'.encode() for name in HOST_TOOLS["claude-code"]}
    found = _contains(cli, *names.values(), b"({file_path:", b"({notebook_path:", b"({pattern:")
    assert [name for name, needle in names.items() if not found[needle]] == []
    assert all(found[key] for key in (b"({file_path:", b"({notebook_path:", b"({pattern:"))
    assert _contains(cli, b'"mcp__"')[b'"mcp__"']  # its MCP tools' prefix


def test_codex_rows_are_its_hook_facing_names() -> None:
    binary = _file(HOSTS_DIR / "codex" / "node_modules" / CODEX_BINARY, "Codex CLI's binary")
    needles = [b"pre-tool-use.command.input", b'"tool_input": true', b"spawn_agent"]
    needles += [b"apply_patch", b"Bash", b"mcp__"]
    found = _contains(binary, *needles)
    assert [needle for needle, hit in found.items() if not hit] == []
    assert set(HOST_TOOLS["codex"]) == {"Bash", "apply_patch", "spawn_agent"}


def _gemini_sources() -> str:
    bundle = HOSTS_DIR / "gemini" / "node_modules" / GEMINI_BUNDLE
    if not bundle.is_dir():
        pytest.skip(f"Gemini CLI is not installed ({bundle}): run its host test to build it")
    return "\n".join(path.read_text(errors="replace") for path in sorted(bundle.glob("*.js")))


def test_gemini_rows_are_its_tool_name_constants() -> None:
    text = _gemini_sources()
    tools = set(re.findall(r'[A-Z_]+_TOOL_NAME = "([a-z_]+)"', text))
    params = set(re.findall(r'[A-Z_]*PARAM[A-Z_]* = "([a-z_]+)"', text))
    assert set(HOST_TOOLS["gemini"]) - tools == set()
    assert {theirs for _, theirs in _renamed_keys("gemini")} - params == set()
    assert 'MCP_TOOL_PREFIX = "mcp_"' in text
    assert 'MCP_QUALIFIED_NAME_SEPARATOR = "_"' in text
    assert "withoutPrefix.match(/^([^_]+)_(.+)$/)" in text  # the server ends at the first _


def test_hermes_rows_are_its_registered_tools() -> None:
    tools_dir = _site_packages("hermes") / "tools"
    text = "\n".join(path.read_text(errors="replace") for path in sorted(tools_dir.glob("*.py")))
    registered = set(re.findall(r'name="([a-z_]+)",', text))
    assert set(HOST_TOOLS["hermes"]) - registered == set()
    assert {theirs for _, theirs in _renamed_keys("hermes")} <= {"pattern"}
    assert '"pattern": {"type": "string"' in text
    mcp = (tools_dir / "mcp_tool.py").read_text()
    assert 'MCP_TOOL_NAME_PREFIX = "mcp__"' in mcp
    assert '_MCP_NAME_DELIM = "__"' in mcp


@pytest.mark.parametrize("host", ["cursor", "agent-code"])
def test_hosts_without_a_package_here_are_documented(host: str) -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "integrations.md").read_text()
    section = docs.split("## One name per tool", 1)[-1]
    for name in HOST_TOOLS[host]:
        assert f"`{name}`" in section, (host, name)
