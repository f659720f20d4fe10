"""One tool, one name, one counter, with the real hosts (issue 28, item 6): one real
`ratewarden serve` on a policy that names only canonical tools (`terminal` 10/minute per
user, an args deny on `terminal`'s `command`), and one user's shell calls spread over
the real Claude Code CLI (bundled in claude-agent-sdk, command hook), the real Codex CLI
and the real Gemini CLI, each driven offline by its scripted model server, plus hermes'
and agent-code's hooks fed their real payloads (tests/hosts/test_hooks.py's harness).

Every host calls the shell by its own name (`Bash`, `run_shell_command`, `terminal`);
the daemon maps each to `terminal` (wire/tools.py), so the calls add up on one counter:
the eleventh, from whichever host, is refused. The root delete the fake models ask for
is `false && rm -rf /`: refused by the rule on every host, and harmless if it were not.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.fake_anthropic import fake_messages_api
from tests.hosts.drivers.codex_responses import fake_responses_api
from tests.hosts.drivers.gemini_api import fake_gemini_api
from tests.hosts.scenario import (
    Daemon,
    bundled_claude,
    daemon_fixture,
    host_cli,
    host_python,
    lines,
    new_user,
)
from tests.hosts.test_hooks import agent_code, claude_pre, hermes_payload, hook
from tests.hosts.test_host_claude_code import ClaudeCode, run_claude
from tests.hosts.test_host_codex import hook_command as codex_hook
from tests.hosts.test_host_codex import run_codex
from tests.hosts.test_host_gemini import hook_command as gemini_hook
from tests.hosts.test_host_gemini import run_gemini

# The first run builds the three CLIs' environments (about 900 MB between them).
pytestmark = pytest.mark.timeout(1800)

POLICY = r"""
version: 1
rules:
  - name: no-root-delete
    match:
      tool: terminal
      args: {command: {regex: '\brm\s+-rf\s+/(\s|$)'}}
    deny: "Refusing to delete the root directory"
  - name: terminal-per-minute
    match: {tool: terminal}
    per: [user]
    rate: 10/minute
"""
MESSAGE = "Rate limit: max 10 terminal calls per minute"
ROOT_DELETE = "Refusing to delete the root directory"
ROOT_COMMAND = "false && rm -rf /"  # never deletes anything, even if it ran

daemon = daemon_fixture(POLICY)


@pytest.fixture(scope="module")
def claude_code() -> ClaudeCode:
    python = host_python("claude_code")
    return ClaudeCode(bundled_claude(python), python.with_name("ratewarden"))


@pytest.fixture(scope="module")
def codex() -> Path:
    return host_cli("codex")


@pytest.fixture(scope="module")
def gemini() -> Path:
    return host_cli("gemini")


def appending(ran: Path) -> str:
    return f"echo ran >> {shlex.quote(str(ran))}"


def claude_calls(
    claude: ClaudeCode, daemon: Daemon, work: Path, user: str, command: str, n: int
) -> list[str]:
    """`n` Bash calls of `user` through the real Claude Code; what the model read of each."""
    work.mkdir(exist_ok=True)
    with fake_messages_api(command, calls=n) as (url, model):
        run_claude(claude, work, url, f"--url {daemon.url} --user {user}")
    return [model.tool_results[call] for call in model.tool_use_ids]


def codex_calls(
    cli: Path, daemon: Daemon, work: Path, user: str, command: str, n: int
) -> list[str]:
    work.mkdir(exist_ok=True)
    with fake_responses_api(command, calls=n) as (url, model):
        run_codex(cli, work, url, codex_hook(f"--url {daemon.url} --user {user}"))
    return [model.tool_results[call] for call in model.call_ids]


def gemini_calls(
    cli: Path, daemon: Daemon, work: Path, user: str, command: str, n: int
) -> list[str]:
    work.mkdir(exist_ok=True)
    with fake_gemini_api(lambda i: command, calls=n) as (url, model):
        run_gemini(cli, work, url, gemini_hook(f"--url {daemon.url} --user {user}"))
    return [model.tool_results[call] for call in model.call_ids]


def hermes_call(daemon: Daemon, user: str, command: str, request: str) -> str:
    """hermes' shell hook on its real pre_tool_call payload; its stdout (empty: allowed)."""
    payload = hermes_payload("pre_tool_call", "terminal", request)
    payload["tool_input"] = {"command": command}
    done = hook("hermes", payload, "--url", daemon.url, "--user", user)
    assert done.returncode == 0, done.stderr
    return done.stdout


def agent_code_call(daemon: Daemon, user: str, command: str) -> Any:
    """agent-code's pre_tool_use shell hook, spawned as agent-code spawns it."""
    ratewarden = shlex.quote(str(Path(sys.executable).with_name("ratewarden")))
    line = f"{ratewarden} hook agent-code --url {daemon.url} --user {user}"
    return agent_code(line, "pre_tool_use", "Bash", {"command": command, "timeout": 120000})


def used(daemon: Daemon, user: str, tool: str) -> dict[str, float]:
    found = httpx.get(f"{daemon.url}/v1/usage", params={"user": user, "tool": tool})
    return {item["rule"]: item["used"] for item in found.raise_for_status().json()["limits"]}


def test_one_users_shell_calls_from_every_host_share_one_counter(
    claude_code: ClaudeCode, codex: Path, gemini: Path, daemon: Daemon, tmp_path: Path
) -> None:
    user, ran = new_user("alice"), tmp_path / "ran.txt"
    command = appending(ran)
    results = claude_calls(claude_code, daemon, tmp_path / "claude", user, command, 3)
    results += codex_calls(codex, daemon, tmp_path / "codex", user, command, 3)
    results += gemini_calls(gemini, daemon, tmp_path / "gemini", user, command, 2)
    assert hermes_call(daemon, user, command, "r1") == ""
    assert agent_code_call(daemon, user, command).returncode == 0
    assert all(MESSAGE not in result for result in results)
    assert lines(ran) == 8  # the CLIs' calls ran; the two hooks' are the hosts' to run
    # One counter, `terminal`'s, whichever host's name the calls came under.
    assert used(daemon, user, "terminal")["terminal-per-minute"] == 10
    # The eleventh, from whichever host, is refused.
    [codex_eleventh] = codex_calls(codex, daemon, tmp_path / "codex-11", user, command, 1)
    [gemini_eleventh] = gemini_calls(gemini, daemon, tmp_path / "gemini-11", user, command, 1)
    [claude_eleventh] = claude_calls(claude_code, daemon, tmp_path / "claude-11", user, command, 1)
    assert all(MESSAGE in text for text in (codex_eleventh, gemini_eleventh, claude_eleventh))
    assert MESSAGE in hermes_call(daemon, user, command, "r2")
    vetoed = agent_code_call(daemon, user, command)
    assert (vetoed.returncode, MESSAGE in vetoed.stderr) == (1, True)
    assert lines(ran) == 8
    # A read-only file tool still runs: Claude Code's Read, by its own payload.
    read = claude_pre("Read", "toolu_read") | {"tool_input": {"file_path": "/etc/hostname"}}
    allowed = hook("claude-code", read, "--url", daemon.url, "--user", user)
    assert (allowed.returncode, allowed.stdout.strip()) == (0, "")


def test_a_root_delete_is_refused_on_every_host(
    claude_code: ClaudeCode, codex: Path, gemini: Path, daemon: Daemon, tmp_path: Path
) -> None:
    user = new_user("bob")
    refused = claude_calls(claude_code, daemon, tmp_path / "claude", user, ROOT_COMMAND, 1)
    refused += codex_calls(codex, daemon, tmp_path / "codex", user, ROOT_COMMAND, 1)
    refused += gemini_calls(gemini, daemon, tmp_path / "gemini", user, ROOT_COMMAND, 1)
    assert all(ROOT_DELETE in text for text in refused), refused
    assert ROOT_DELETE in hermes_call(daemon, user, ROOT_COMMAND, "r1")
    vetoed = agent_code_call(daemon, user, ROOT_COMMAND)
    assert (vetoed.returncode, vetoed.stderr.strip()) == (1, ROOT_DELETE)
    denials = httpx.get(f"{daemon.url}/v1/denials", params={"user": user}).json()["denials"]
    assert len(denials) == 5
