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
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.hosts.drivers.gemini_api import fake_gemini_api
from tests.hosts.scenario import Daemon, clean_environment, daemon_fixture, host_cli, lines, nowhere

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
APPROVAL = "A human must approve this call before it can run"
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
    """`ratewarden hook gemini FLAGS` from this checkout; `stdin` goes first (to feed the
    hook something else than Gemini's payload)."""
    return f"{stdin}{shlex.quote(sys.executable)} -m ratewarden hook gemini {flags}"


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


def test_real_gemini_ask_is_a_deny_that_says_a_human_must_approve(
    gemini: Path, daemon: Daemon, tmp_path: Path
) -> None:
    ran = tmp_path / "ran.txt"
    with fake_gemini_api(appending(ran), calls=1) as (url, model):
        run_gemini(gemini, tmp_path, url, hook_command(f"--url {daemon.url} --user intern-1"))
    assert lines(ran) == 0
    result = model.tool_results[model.call_ids[0]]
    assert "Rate limit: max 0 terminal calls per minute" in result
    assert APPROVAL in result


def test_real_gemini_with_the_daemon_down(gemini: Path, tmp_path: Path) -> None:
    dead = nowhere()
    ran = tmp_path / "ran.txt"
    # Failing open (the default): the call runs.
    with fake_gemini_api(appending(ran), calls=1) as (url, model):
        run_gemini(gemini, tmp_path, url, hook_command(f"--url {dead}"))
    assert lines(ran) == 1
    assert PAUSED not in model.tool_results[model.call_ids[0]]
    # Failing closed: the model is told the guard is unavailable, and nothing runs.
    with fake_gemini_api(appending(ran), calls=1) as (url, model):
        run_gemini(gemini, tmp_path, url, hook_command(f"--url {dead} --fail closed"))
    assert lines(ran) == 1
    assert PAUSED in model.tool_results[model.call_ids[0]]


def test_real_gemini_unreadable_input(gemini: Path, tmp_path: Path) -> None:
    # A broken installation (the hook fed garbage instead of Gemini's JSON): failing open,
    # exit 1 is a warning and the call runs; failing closed, exit 2 blocks it and Gemini
    # hands our stderr to the model.
    ran = tmp_path / "ran.txt"
    dead = nowhere()
    garbage = "cat > /dev/null; echo garbage | "
    with fake_gemini_api(appending(ran), calls=1) as (url, model):
        run_gemini(gemini, tmp_path, url, hook_command(f"--url {dead}", stdin=garbage))
    assert lines(ran) == 1
    with fake_gemini_api(appending(ran), calls=1) as (url, model):
        command = hook_command(f"--url {dead} --fail closed", stdin=garbage)
        run_gemini(gemini, tmp_path, url, command)
    assert lines(ran) == 1
    result = model.tool_results[model.call_ids[0]]
    assert "Tool guard unavailable: cannot read the gemini hook input" in result
