"""The real Claude Code CLI (the one bundled in the claude-agent-sdk wheel) runs
`ratewarden hook claude-code` as its PreToolUse / PostToolUse command hook, and posts the
same payloads to the daemon's `/v1/hooks/claude-code` as an `http` hook (no process per
call).

Offline: the CLI talks to a scripted Messages API on loopback (tests/helpers/fake_anthropic.py),
with HOME in a temporary directory and non-essential traffic off. The fake model asks for
`Bash` again and again; each Bash call appends a line to a file, so the test counts what
really ran rather than trusting the hook.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.fake_anthropic import fake_messages_api
from tests.hosts.scenario import (
    Daemon,
    bundled_claude,
    daemon_fixture,
    host_python,
    nowhere,
    running_daemon,
)

# The first run builds the host's venv (the wheel bundles a 381 MB CLI).
pytestmark = pytest.mark.timeout(900)

POLICY = """\
version: 1
tools:
  Bash: {label: terminal}
rules:
  - name: terminal-per-minute
    match: {tool: Bash}
    per: [user]
    rate: 10/minute
  - name: one-bash-at-a-time     # call after call passes only if PostToolUse settles each
    match: {tool: Bash}
    per: [user]
    concurrency: 1
  - name: interns-ask-first
    match: {tool: Bash, user: "intern-*"}
    rate: 0/minute
    on_exceed: ask
"""
MESSAGE = "Rate limit: max 10 terminal calls per minute"
PAUSED = "Tool guard unavailable; Bash calls are paused"


@dataclass
class ClaudeCode:
    cli: Path  # the bundled `claude` executable
    ratewarden: Path  # the console script in the same venv, as a user would install it


@pytest.fixture(scope="module")
def claude_code() -> ClaudeCode:
    python = host_python("claude_code")
    cli = bundled_claude(python)
    assert os.access(cli, os.X_OK), f"no bundled CLI at {cli}"
    return ClaudeCode(cli, python.with_name("ratewarden"))


daemon = daemon_fixture(POLICY)


def hooks_settings(command: str) -> str:
    """The `hooks` block of a settings.json, as docs/integrations.md shows it."""
    entry = [{"matcher": "Bash", "hooks": [{"type": "command", "command": command}]}]
    return json.dumps({"hooks": {"PreToolUse": entry, "PostToolUse": entry}})


def http_hooks_settings(url: str, token: bool = False) -> str:
    """The `hooks` block of an `http` hook, as docs/integrations.md shows it: the token
    from the environment (Claude Code interpolates only the variables listed)."""
    hook: dict[str, Any] = {"type": "http", "url": url, "timeout": 5}
    if token:
        hook["headers"] = {"Authorization": "Bearer $RATEWARDEN_TOKEN"}
        hook["allowedEnvVars"] = ["RATEWARDEN_TOKEN"]
    entry = [{"matcher": "Bash", "hooks": [hook]}]
    return json.dumps({"hooks": {"PreToolUse": entry, "PostToolUse": entry}})


def run_claude(
    claude: ClaudeCode,
    tmp_path: Path,
    model_url: str,
    hook_flags: str = "",
    stdin: str = "",
    *,
    settings: str | None = None,
    extra_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """`claude -p` with our hooks; returns its JSON result. The command hook with
    `hook_flags`, or the given `settings`; `stdin` goes before the hook command (to feed
    it something else than Claude Code's payload)."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": model_url,
        "ANTHROPIC_API_KEY": "sk-ant-fake",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        **(extra_env or {}),
    }
    command = f"{stdin}{shlex.quote(str(claude.ratewarden))} hook claude-code {hook_flags}"
    if settings is None:
        settings = hooks_settings(command)
    done = subprocess.run(
        [
            str(claude.cli),
            "-p",
            "Append a line to the file, again and again.",
            "--output-format",
            "json",
            "--settings",
            settings,
            "--allowedTools",
            "Bash",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"claude failed:\n{done.stdout}\n{done.stderr}"
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_real_claude_code_stops_the_11th_bash_call(
    claude_code: ClaudeCode, daemon: Daemon, tmp_path: Path
) -> None:
    ran = tmp_path / "ran.txt"
    with fake_messages_api(f"echo ran >> {shlex.quote(str(ran))}", calls=11) as (url, model):
        result = run_claude(claude_code, tmp_path, url, f"--url {daemon.url} --user carol")
    assert result["is_error"] is False, result
    assert len(model.tool_use_ids) == 11
    assert lines(ran) == 10  # the command ran 10 times, not 11
    allowed, denied = model.tool_use_ids[:10], model.tool_use_ids[10]
    assert MESSAGE in model.tool_results[denied]
    assert all(MESSAGE not in model.tool_results[call] for call in allowed)
    assert [d["tool_use_id"] for d in result["permission_denials"]] == [denied]
    # Each allowed call was settled by PostToolUse, or the concurrency cap of 1 would have
    # refused the second; and the calls were counted for the --user we gave.
    usage = httpx.get(f"{daemon.url}/v1/usage", params={"user": "carol", "tool": "Bash"}).json()
    used = {item["rule"]: item["used"] for item in usage["limits"]}
    assert used == {"terminal-per-minute": 10, "one-bash-at-a-time": 0}
    [denial] = httpx.get(f"{daemon.url}/v1/denials", params={"user": "carol"}).json()["denials"]
    assert (denial["call_id"], denial["session"]) == (denied, result["session_id"])


def test_real_claude_code_with_the_daemon_down(claude_code: ClaudeCode, tmp_path: Path) -> None:
    dead = nowhere()
    ran = tmp_path / "ran.txt"
    command = f"echo ran >> {shlex.quote(str(ran))}"
    # Failing open (the default): the call runs.
    with fake_messages_api(command, calls=1) as (url, model):
        run_claude(claude_code, tmp_path, url, f"--url {dead}")
    assert lines(ran) == 1
    assert PAUSED not in model.tool_results[model.tool_use_ids[0]]
    # Failing closed: the model is told the guard is unavailable, and nothing runs.
    with fake_messages_api(command, calls=1) as (url, model):
        result = run_claude(claude_code, tmp_path, url, f"--url {dead} --fail closed")
    assert lines(ran) == 1
    assert PAUSED in model.tool_results[model.tool_use_ids[0]]
    assert len(result["permission_denials"]) == 1


def test_real_claude_code_ask_without_a_human_is_refused(
    claude_code: ClaudeCode, daemon: Daemon, tmp_path: Path
) -> None:
    # `permissionDecision: ask` needs someone at the prompt; `claude -p` has no one, so the
    # call is refused with our reason, even with `--allowedTools Bash`.
    ran = tmp_path / "ran.txt"
    with fake_messages_api(f"echo ran >> {shlex.quote(str(ran))}", calls=1) as (url, model):
        result = run_claude(claude_code, tmp_path, url, f"--url {daemon.url} --user intern-1")
    assert lines(ran) == 0
    [call] = model.tool_use_ids
    assert "Rate limit: max 0 terminal calls per minute" in model.tool_results[call]
    assert [d["tool_use_id"] for d in result["permission_denials"]] == [call]


def test_real_claude_code_unreadable_input_failing_closed_blocks(
    claude_code: ClaudeCode, tmp_path: Path
) -> None:
    # A broken installation (here: the hook fed garbage instead of Claude Code's JSON):
    # failing closed, exit 2 blocks the call and Claude Code hands our stderr to the model.
    ran = tmp_path / "ran.txt"
    dead = nowhere()
    garbage = "cat > /dev/null; echo garbage | "
    with fake_messages_api(f"echo ran >> {shlex.quote(str(ran))}", calls=1) as (url, model):
        run_claude(claude_code, tmp_path, url, f"--url {dead} --fail closed", stdin=garbage)
    assert lines(ran) == 0
    [call] = model.tool_use_ids
    assert (
        "Tool guard unavailable: cannot read the claude-code hook input"
        in (model.tool_results[call])
    )


# -- the same through Claude Code's `http` hook: the daemon answers, no process per call --


def test_real_claude_code_http_hook_stops_the_11th_bash_call(
    claude_code: ClaudeCode, tmp_path: Path
) -> None:
    ran = tmp_path / "ran.txt"
    with running_daemon(POLICY, tmp_path / "daemon", "--api-token", "hook-token") as daemon:
        settings = http_hooks_settings(f"{daemon.url}/v1/hooks/claude-code?user=dave", token=True)
        with fake_messages_api(f"echo ran >> {shlex.quote(str(ran))}", calls=11) as (url, model):
            result = run_claude(
                claude_code, tmp_path, url, settings=settings,
                extra_env={"RATEWARDEN_TOKEN": "hook-token"},
            )  # fmt: skip
        headers = {"authorization": "Bearer hook-token"}
        usage = httpx.get(
            f"{daemon.url}/v1/usage", params={"user": "dave", "tool": "Bash"}, headers=headers
        ).json()
    assert result["is_error"] is False, result
    assert len(model.tool_use_ids) == 11
    assert lines(ran) == 10
    denied = model.tool_use_ids[10]
    assert MESSAGE in model.tool_results[denied]
    assert all(MESSAGE not in model.tool_results[c] for c in model.tool_use_ids[:10])
    assert [d["tool_use_id"] for d in result["permission_denials"]] == [denied]
    # PostToolUse reached the daemon over HTTP too: every call settled (one at a time).
    used = {item["rule"]: item["used"] for item in usage["limits"]}
    assert used == {"terminal-per-minute": 10, "one-bash-at-a-time": 0}


def test_real_claude_code_http_hook_without_the_token_or_the_daemon_runs_the_call(
    claude_code: ClaudeCode, tmp_path: Path
) -> None:
    """What Claude Code does when its `http` hook gets no answer it can use (the daemon
    down, or a 401): a non-blocking hook error, so the call runs. That is the host's own
    failure setting, as documented; failing closed needs the command hook."""
    ran = tmp_path / "ran.txt"
    command = f"echo ran >> {shlex.quote(str(ran))}"
    dead = f"{nowhere()}/v1/hooks/claude-code?user=erin"
    with fake_messages_api(command, calls=1) as (url, model):
        run_claude(claude_code, tmp_path, url, settings=http_hooks_settings(dead))
    assert lines(ran) == 1
    with running_daemon(POLICY, tmp_path / "daemon", "--api-token", "hook-token") as daemon:
        unauthorized = http_hooks_settings(f"{daemon.url}/v1/hooks/claude-code?user=erin")
        with fake_messages_api(command, calls=1) as (url, model):
            run_claude(claude_code, tmp_path, url, settings=unauthorized)
    assert lines(ran) == 2
    [call] = model.tool_use_ids
    assert MESSAGE not in model.tool_results[call]


def test_real_claude_code_http_hook_asks_and_a_headless_run_refuses(
    claude_code: ClaudeCode, daemon: Daemon, tmp_path: Path
) -> None:
    ran = tmp_path / "ran.txt"
    settings = http_hooks_settings(f"{daemon.url}/v1/hooks/claude-code?user=intern-2")
    with fake_messages_api(f"echo ran >> {shlex.quote(str(ran))}", calls=1) as (url, model):
        result = run_claude(claude_code, tmp_path, url, settings=settings)
    assert lines(ran) == 0
    [call] = model.tool_use_ids
    assert "Rate limit: max 0 terminal calls per minute" in model.tool_results[call]
    assert [d["tool_use_id"] for d in result["permission_denials"]] == [call]
