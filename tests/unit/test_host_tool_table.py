"""wire/tools.py: each host's names for the common tools, and their one canonical shape.

The table's rows are checked against the installed hosts in
tests/hosts/test_tool_table_sources.py; here, what `canonical` makes of any input.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from ratewarden.wire.tools import (
    CANONICAL_TOOLS,
    HOST_TOOLS,
    Canonical,
    canonical,
    hosts_naming,
    mcp_tool,
    shell_command,
)

HOSTS = ("claude-code", "codex", "gemini", "cursor", "agent-code", "hermes")
SHELLS = {
    "claude-code": "Bash",
    "codex": "Bash",
    "gemini": "run_shell_command",
    "cursor": "Shell",
    "agent-code": "Bash",
    "hermes": "terminal",
}


def test_every_host_of_the_hooks_has_a_table() -> None:
    from ratewarden.hooks.hosts import HOSTS as HOOKED

    assert set(HOST_TOOLS) == set(HOOKED) == set(HOSTS)


def test_every_row_names_a_canonical_tool() -> None:
    for host, tools in HOST_TOOLS.items():
        for name, row in tools.items():
            assert row.canonical in CANONICAL_TOOLS, (host, name)
            assert all(isinstance(k, str) and isinstance(v, str) for k, v in row.args.items())


@pytest.mark.parametrize("host", HOSTS)
def test_each_hosts_shell_is_terminal_with_its_command(host: str) -> None:
    found = canonical(host, SHELLS[host], {"command": "rm -rf /", "timeout": 5})
    assert found.tool == "terminal"
    assert found.args == {"command": "rm -rf /", "timeout": 5}  # the others stay
    assert found.host_tool == (None if host == "hermes" else SHELLS[host])


@pytest.mark.parametrize(
    ("host", "tool", "args", "expected"),
    [
        ("claude-code", "Read", {"file_path": "/a", "limit": 3}, {"path": "/a", "limit": 3}),
        ("claude-code", "NotebookEdit", {"notebook_path": "/n"}, {"path": "/n"}),
        ("claude-code", "Grep", {"pattern": "x", "path": "/d"}, {"query": "x", "path": "/d"}),
        ("gemini", "glob", {"pattern": "*.py", "dir_path": "/d"}, {"query": "*.py", "path": "/d"}),
        (
            "gemini",
            "replace",
            {"file_path": "/a", "old_string": "o"},
            {"path": "/a", "old_string": "o"},
        ),
        ("cursor", "Grep", {"pattern": "x", "file_path": "/d"}, {"query": "x", "path": "/d"}),
        ("cursor", "Delete", {"file_path": "/a"}, {"path": "/a"}),
        (
            "agent-code",
            "FileWrite",
            {"file_path": "/a", "content": "c"},
            {"path": "/a", "content": "c"},
        ),
        ("codex", "apply_patch", {"command": "*** Begin Patch"}, {"patch": "*** Begin Patch"}),
        (
            "hermes",
            "search_files",
            {"pattern": "x", "target": "content"},
            {"query": "x", "target": "content"},
        ),
        (
            "claude-code",
            "WebFetch",
            {"url": "https://x", "prompt": "p"},
            {"url": "https://x", "prompt": "p"},
        ),
    ],
)
def test_arguments_move_to_their_canonical_keys(
    host: str, tool: str, args: dict[str, Any], expected: dict[str, Any]
) -> None:
    before = dict(args)
    assert canonical(host, tool, args).args == expected
    assert args == before  # the host's dict is not changed


def test_the_hosts_own_key_wins_over_a_decoy_canonical_key() -> None:
    """Claude Code's Read opens `file_path`: a `path` beside it must not be what a rule on
    `path` reads (it would see /tmp/x while the host opened /etc/shadow)."""
    found = canonical("claude-code", "Read", {"file_path": "/etc/shadow", "path": "/tmp/x"})
    assert found.args == {"path": "/etc/shadow"}


@pytest.mark.parametrize("args", [None, "rm -rf /", 7, ["ls"], [{"command": "x"}], True, 1.5])
def test_args_that_are_not_an_object_are_left_as_they_are(args: object) -> None:
    assert canonical("claude-code", "Bash", args) == Canonical("terminal", args, "Bash")


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["bash", "-lc", "rm -rf /"], "rm -rf /"),
        (["/bin/sh", "-c", "echo hi && ls"], "echo hi && ls"),
        (["zsh", "-ic", "x"], "x"),
        (["rm", "-rf", "/"], "rm -rf /"),
        (["echo", "a b", "$HOME"], "echo 'a b' '$HOME'"),
        (["bash", "-l", "x"], "bash -l x"),  # not a script flag: words as they are
        (["bash", "-lc"], "bash -lc"),
        (["python", "-c", "print(1)"], "python -c 'print(1)'"),  # not a shell
    ],
)
def test_an_argv_command_becomes_the_line_the_shell_reads(argv: list[str], command: str) -> None:
    found = canonical("codex", "Bash", {"command": argv, "workdir": "/w"})
    assert found.args == {"command": command, "workdir": "/w"}
    assert shell_command(argv) == command


@pytest.mark.parametrize(
    "command",
    [[], ["rm", 1], ["rm", None], [["rm"]], ["rm", {"a": 1}], ("rm",), {"argv": ["rm"]}, 12],
)
def test_an_odd_command_is_left_as_it_is(command: object) -> None:
    found = canonical("codex", "Bash", {"command": command})
    assert found.args == {"command": command}


def test_a_huge_and_deep_command_is_joined_without_trouble() -> None:
    argv = ["echo"] + ["x" * 1000] * 2000
    assert canonical("agent-code", "Bash", {"command": argv}).args["command"].startswith("echo x")
    deep: Any = "x"
    for _ in range(500):
        deep = {"a": deep}
    found = canonical("cursor", "Read", {"file_path": deep})
    assert found.args == {"path": deep}


@pytest.mark.parametrize(
    ("host", "tool", "gateway"),
    [
        ("claude-code", "mcp__github__create_issue", "github.create_issue"),
        ("codex", "mcp__fs__read__x", "fs.read__x"),
        ("agent-code", "mcp__db__query", "db.query"),
        ("hermes", "mcp__my_server__list_files", "my_server.list_files"),
        ("gemini", "mcp_github_create_issue", "github.create_issue"),
    ],
)
def test_mcp_tools_are_named_as_the_gateway_names_them(host: str, tool: str, gateway: str) -> None:
    assert canonical(host, tool, {"a": 1}) == Canonical(gateway, {"a": 1}, tool)
    assert hosts_naming(tool)[host] == gateway


@pytest.mark.parametrize(
    ("host", "tool"),
    [
        ("cursor", "MCP:create_issue"),  # Cursor names no server
        ("claude-code", "mcp__"),
        ("claude-code", "mcp__server"),
        ("claude-code", "mcp__server__"),
        ("gemini", "mcp__x"),  # not Gemini's form: `mcp_` then an empty server
        ("gemini", "mcp_server"),
        (None, "mcp__a__b"),  # no host: the name is what the caller chose
        ("langchain", "Bash"),
    ],
)
def test_names_no_table_knows_keep_their_name(host: str | None, tool: str) -> None:
    assert canonical(host, tool, {"x": 1}) == Canonical(tool, {"x": 1})
    assert mcp_tool(host, tool) is None


def test_hosts_naming_says_which_hosts_call_a_tool_so() -> None:
    assert hosts_naming("Bash") == {
        "claude-code": "terminal",
        "codex": "terminal",
        "agent-code": "terminal",
    }
    assert hosts_naming("run_shell_command") == {"gemini": "terminal"}
    assert hosts_naming("terminal") == {}  # hermes' own name is the canonical one
    assert hosts_naming("no_such_tool") == {}


def test_the_table_costs_no_import() -> None:
    """The hook's start-up budget: wire/tools.py imports nothing heavy (shlex only when
    an argv is joined)."""
    code = (
        "import sys; import ratewarden.wire.tools as t; "
        "t.canonical('claude-code', 'Bash', {'command': 'ls'}); "
        "print(' '.join(m for m in ('shlex', 'pydantic', 're', 'json') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "shlex" not in done.stdout.split()
    assert "pydantic" not in done.stdout.split()


def test_the_hermes_plugin_names_its_host_for_the_daemon_to_map() -> None:
    from ratewarden.client import Guard
    from ratewarden.integrations.hermes import RatewardenPlugin

    plugin = RatewardenPlugin(guard=Guard("http://127.0.0.1:9"), user=lambda hook: "u")
    try:
        request = plugin.request_for("patch", {"args": {"path": "/a"}, "tool_call_id": "c"})
    finally:
        plugin.guard.close()
    assert (request.host, request.tool, request.host_tool) == ("hermes", "patch", None)
