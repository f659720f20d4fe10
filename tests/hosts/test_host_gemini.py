"""The real Gemini CLI (`@google/gemini-cli` from the npm registry) runs
`ratewarden hook gemini` as its BeforeTool command hook.

Offline: `gemini -p` talks to a scripted Gemini API on loopback
(tests/hosts/drivers/gemini_api.py) through GOOGLE_GEMINI_BASE_URL, with a fake
GEMINI_API_KEY and HOME in a temporary directory (its ~/.gemini/settings.json holds the
hook). The fake model asks for `run_shell_command` again and again; each call that runs
appends a line to a file, so the test counts what really ran rather than trusting the
hook. Gemini names no call in its hook payloads, so nothing is settled: the policy
holds no concurrency rule.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.hosts.drivers.gemini_api import fake_gemini_api
from tests.hosts.scenario import (
    Daemon,
    ShellCli,
    clean_environment,
    daemon_fixture,
    hook_for,
    host_cli,
    lines,
)

pytestmark = pytest.mark.timeout(900)  # the first run installs the CLI

POLICY = """\
version: 1
tools:
  run_shell_command: {label: terminal}
rules:
  - name: terminal-per-minute
    match: {tool: run_shell_command}
    per: [user]
    rate: 10/minute
  - name: interns-ask-first
    match: {tool: run_shell_command, user: "intern-*"}
    rate: 0/minute
    on_exceed: ask
"""
MESSAGE = "Rate limit: max 10 terminal calls per minute"
PAUSED = "Tool guard unavailable; run_shell_command calls are paused"


def settings(command: str) -> dict[str, object]:
    """~/.gemini/settings.json, as docs/integrations.md ("Gemini CLI") shows it (plus what a
    test home needs: an auth type without a login, and no folder-trust prompt)."""
    hook = {"type": "command", "command": command, "timeout": 30000}
    return {
        "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
        "privacy": {"usageStatisticsEnabled": False},
        "hooks": {"BeforeTool": [{"matcher": "run_shell_command", "hooks": [hook]}]},
    }


@pytest.fixture(scope="module")
def gemini() -> Path:
    return host_cli("gemini")


daemon = daemon_fixture(POLICY)


def hook_command(flags: str, stdin: str = "") -> str:
    """`ratewarden hook gemini FLAGS` from this checkout (scenario.hook_for)."""
    return hook_for("gemini", flags, stdin)


def run_gemini(cli: Path, tmp_path: Path, model_url: str, command: str) -> str:
    """`gemini -p ... --yolo` with our hook; returns its output."""
    home = tmp_path / "home"
    work = tmp_path / "work"
    (home / ".gemini").mkdir(parents=True, exist_ok=True)
    work.mkdir(exist_ok=True)
    (home / ".gemini" / "settings.json").write_text(json.dumps(settings(command)))
    env = clean_environment(
        HOME=str(home), GEMINI_API_KEY="fake", GOOGLE_GEMINI_BASE_URL=model_url, NO_COLOR="1"
    )
    for name in ("GOOGLE_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_GENAI_USE_GCA"):
        env.pop(name, None)
    done = subprocess.run(
        [
            str(cli),
            "-p",
            "Append a line to the file, again and again.",
            "--yolo",
            "-m",
            "gemini-2.5-flash",
        ],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"gemini failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def appending(ran: Path) -> Callable[[int], str]:
    return lambda n: f"echo ran {n} >> {shlex.quote(str(ran))}"


def test_real_gemini_stops_the_11th_shell_call(
    gemini: Path, daemon: Daemon, tmp_path: Path
) -> None:
    ran = tmp_path / "ran.txt"
    with fake_gemini_api(appending(ran), calls=11) as (url, model):
        run_gemini(gemini, tmp_path, url, hook_command(f"--url {daemon.url} --user carol"))
    assert len(model.call_ids) == 11
    assert lines(ran) == 10  # the command ran 10 times, not 11
    allowed, denied = model.call_ids[:10], model.call_ids[10]
    assert MESSAGE in model.tool_results[denied]
    assert all(MESSAGE not in model.tool_results[call] for call in allowed)
    usage = httpx.get(
        f"{daemon.url}/v1/usage", params={"user": "carol", "tool": "run_shell_command"}
    )
    assert {item["rule"]: item["used"] for item in usage.json()["limits"]} == {
        "terminal-per-minute": 10
    }
    # Another user still gets through.
    with fake_gemini_api(appending(ran), calls=1) as (url, model):
        run_gemini(gemini, tmp_path, url, hook_command(f"--url {daemon.url} --user dave"))
    assert lines(ran) == 11
    assert MESSAGE not in model.tool_results[model.call_ids[0]]


def one_call(gemini: Path, tmp_path: Path) -> ShellCli:
    """Gemini CLI run for one shell call (scenario.ShellCli)."""
    return ShellCli(
        "gemini",
        PAUSED,
        serve=lambda ran: fake_gemini_api(appending(ran), calls=1),
        run=lambda url, hook: run_gemini(gemini, tmp_path, url, hook),
    )


def test_real_gemini_ask_is_a_deny_that_says_a_human_must_approve(
    gemini: Path, daemon: Daemon, tmp_path: Path
) -> None:
    one_call(gemini, tmp_path).refuses_an_ask(daemon, tmp_path / "ran.txt")


def test_real_gemini_with_the_daemon_down(gemini: Path, tmp_path: Path) -> None:
    one_call(gemini, tmp_path).follows_the_fail_mode_with_the_daemon_down(tmp_path / "ran.txt")


def test_real_gemini_unreadable_input(gemini: Path, tmp_path: Path) -> None:
    one_call(gemini, tmp_path).follows_the_fail_mode_on_unreadable_input(tmp_path / "ran.txt")
