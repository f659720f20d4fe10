"""The real Codex CLI (`@openai/codex` from the npm registry) runs `ratewarden hook codex`
as its PreToolUse / PostToolUse command hook.

Offline: `codex exec` talks to a scripted Responses API on loopback
(tests/hosts/drivers/codex_responses.py), declared as a custom model provider in a
temporary CODEX_HOME's config.toml (`base_url`, `wire_api = "responses"`), with HOME in
a temporary directory. The fake model asks for its shell tool again and again; each call
that runs appends a line to a file, so the test counts what really ran rather than
trusting the hook. The hooks keep their ledger of open calls (hooks/ledger.py) under that
temporary HOME. Codex runs a user's hooks only once they are trusted (its TUI's
/hooks); `--dangerously-bypass-hook-trust` stands in for that here.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.hosts.drivers.codex_responses import fake_responses_api
from tests.hosts.scenario import (
    Daemon,
    ShellCli,
    appending,
    clean_environment,
    daemon_fixture,
    hook_for,
    host_cli,
    lines,
    running_daemon,
    settles,
    usage_of,
)

# The first run installs the CLI (about 400 MB with its prebuilt binary).
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
# docs/integrations.md ("Codex CLI") shows the same block.
CONFIG = """\
model = "fake-model"
model_provider = "fake"

[model_providers.fake]
name = "fake"
base_url = {base_url}
wire_api = "responses"
env_key = "FAKE_API_KEY"
request_max_retries = 0
stream_max_retries = 0

[[hooks.PreToolUse]]
matcher = "Bash"
[[hooks.PreToolUse.hooks]]
type = "command"
command = {command}
timeout = 30

[[hooks.PostToolUse]]
matcher = "Bash"
[[hooks.PostToolUse.hooks]]
type = "command"
command = {command}
timeout = 30
"""


OTHER_PRE_HOOK = """
[[hooks.PreToolUse]]
matcher = "Bash"
[[hooks.PreToolUse.hooks]]
type = "command"
command = {command}
timeout = 30
"""
# Where else the hook would keep its ledger: in the test's HOME instead (ledger_of).
LEDGER_PLACES = ("XDG_RUNTIME_DIR", "XDG_CACHE_HOME")


@pytest.fixture(scope="module")
def codex() -> Path:
    return host_cli("codex")


daemon = daemon_fixture(POLICY)


def hook_command(flags: str, stdin: str = "") -> str:
    """`ratewarden hook codex FLAGS` from this checkout (scenario.hook_for)."""
    return hook_for("codex", flags, stdin)


def run_codex(
    cli: Path, tmp_path: Path, model_url: str, command: str, other_hook: str | None = None
) -> str:
    """`codex exec` with our hooks (and `other_hook`, another PreToolUse command hook);
    returns its output."""
    home = tmp_path / "home"
    codex_home = tmp_path / "codex-home"
    work = tmp_path / "work"
    for folder in (home, codex_home, work):
        folder.mkdir(exist_ok=True)
    config = CONFIG.format(base_url=json.dumps(model_url), command=json.dumps(command))
    if other_hook is not None:
        config += OTHER_PRE_HOOK.format(command=json.dumps(other_hook))
    (codex_home / "config.toml").write_text(config)
    env = clean_environment(HOME=str(home), CODEX_HOME=str(codex_home), FAKE_API_KEY="fake")
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "CODEX_API_KEY", *LEDGER_PLACES):
        env.pop(name, None)
    done = subprocess.run(
        [
            str(cli),
            "exec",
            "--skip-git-repo-check",
            "--dangerously-bypass-hook-trust",
            "--sandbox",
            "danger-full-access",
            "Append a line to the file, again and again.",
        ],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"codex failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def test_real_codex_stops_the_11th_shell_call(codex: Path, daemon: Daemon, tmp_path: Path) -> None:
    ran = tmp_path / "ran.txt"
    with fake_responses_api(appending(ran), calls=11) as (url, model):
        run_codex(codex, tmp_path, url, hook_command(f"--url {daemon.url} --user carol"))
    assert len(model.call_ids) == 11
    assert lines(ran) == 10  # the command ran 10 times, not 11
    allowed, denied = model.call_ids[:10], model.call_ids[10]
    assert MESSAGE in model.tool_results[denied]
    assert all(MESSAGE not in model.tool_results[call] for call in allowed)
    # Each allowed call was settled by PostToolUse (or the concurrency cap of 1 would
    # have refused the second), and counted for the --user given.
    assert usage_of(daemon, "carol", "Bash") == {"terminal-per-minute": 10, "one-bash-at-a-time": 0}
    [denial] = httpx.get(f"{daemon.url}/v1/denials", params={"user": "carol"}).json()["denials"]
    assert denial["call_id"].startswith(f"{denied}~")  # the model's id, made unique
    # Another user still gets through.
    with fake_responses_api(appending(ran), calls=1) as (url, model):
        run_codex(codex, tmp_path, url, hook_command(f"--url {daemon.url} --user dave"))
    assert lines(ran) == 11
    assert MESSAGE not in model.tool_results[model.call_ids[0]]


def ledger_of(tmp_path: Path) -> list[str]:
    """What the hooks left in their ledger folder (its lock file stays)."""
    folder = tmp_path / "home" / ".cache" / "ratewarden" / "codex"
    return sorted(path.name for path in folder.iterdir())


def test_real_codex_settles_every_call_when_the_model_reuses_call_0(
    codex: Path, daemon: Daemon, tmp_path: Path
) -> None:
    # Several local and open-model servers give every tool call the id `call_0`, and
    # Codex's turn_id is the same for every call of a prompt: the hooks pair each
    # PostToolUse with its PreToolUse, so each call is settled under its own id.
    ran = tmp_path / "ran.txt"
    with fake_responses_api(appending(ran), calls=10, same_id="call_0") as (url, model):
        run_codex(codex, tmp_path, url, hook_command(f"--url {daemon.url} --user erin"))
    assert model.call_ids == ["call_0"] * 10
    assert lines(ran) == 10  # the concurrency cap of 1 refused none of them
    assert len(model.outputs) == 10
    assert not [output for output in model.outputs if "PreToolUse hook" in output]
    assert usage_of(daemon, "erin", "Bash") == {"terminal-per-minute": 10, "one-bash-at-a-time": 0}
    assert settles(daemon) == {"settled": 10}  # none already_settled, none unknown
    assert ledger_of(tmp_path) == [".lock"]  # every call closed, no session file left


PARALLEL_POLICY = POLICY.replace("concurrency: 1", "concurrency: 2")


def test_real_codex_settles_parallel_calls_that_share_call_0(codex: Path, tmp_path: Path) -> None:
    # Codex runs the calls of one response at once (their hooks too): two calls with the
    # same id and the same command are alike, and each PostToolUse closes one of them.
    ran = tmp_path / "ran.txt"
    both = f"echo start >> {ran}; sleep 0.5; echo end >> {ran}"
    with (
        running_daemon(PARALLEL_POLICY, tmp_path / "daemon") as daemon,
        fake_responses_api(both, calls=10, same_id="call_0", parallel=2) as (url, model),
    ):
        run_codex(codex, tmp_path, url, hook_command(f"--url {daemon.url} --user erin"))
        assert usage_of(daemon, "erin", "Bash") == {
            "terminal-per-minute": 10,
            "one-bash-at-a-time": 0,
        }
        assert settles(daemon) == {"settled": 10}
    assert model.call_ids == ["call_0"] * 10
    assert not [output for output in model.outputs if "PreToolUse hook" in output]
    runs = ran.read_text().split()
    assert runs.count("start") == runs.count("end") == 10
    assert "start start" in " ".join(runs)  # two of them did run at the same time
    assert ledger_of(tmp_path) == [".lock"]


def test_real_codex_settles_calls_whose_input_another_hook_rewrote(
    codex: Path, daemon: Daemon, tmp_path: Path
) -> None:
    # Codex 0.169.0 runs a PreToolUse hook's `updatedInput` (with "allow"), and hands the
    # PostToolUse the rewritten input, while ratewarden's PreToolUse saw the original:
    # the PostToolUse finds its call by the model's id and the tool.
    ran = tmp_path / "ran.txt"
    rewriter = tmp_path / "rewrite.sh"
    rewritten = {"command": f"echo rewritten >> {shlex.quote(str(ran))}"}
    answer = {"hookEventName": "PreToolUse", "permissionDecision": "allow"}
    output = json.dumps({"hookSpecificOutput": {**answer, "updatedInput": rewritten}})
    rewriter.write_text(f"#!/bin/sh\ncat > /dev/null\necho {shlex.quote(output)}\n")
    rewriter.chmod(0o755)
    with fake_responses_api(appending(ran), calls=3) as (url, model):
        command = hook_command(f"--url {daemon.url} --user erin")
        run_codex(codex, tmp_path, url, command, other_hook=str(rewriter))
    assert len(set(model.call_ids)) == 3  # the model's own ids, all different
    assert ran.read_text().split() == ["rewritten"] * 3  # concurrency 1 refused none
    assert usage_of(daemon, "erin", "Bash") == {"terminal-per-minute": 3, "one-bash-at-a-time": 0}
    assert settles(daemon) == {"settled": 3}
    assert ledger_of(tmp_path) == [".lock"]


def one_call(codex: Path, tmp_path: Path) -> ShellCli:
    """Codex run for one shell call (scenario.ShellCli)."""
    return ShellCli(
        "codex",
        PAUSED,
        serve=lambda ran: fake_responses_api(appending(ran), calls=1),
        run=lambda url, hook: run_codex(codex, tmp_path, url, hook),
    )


def test_real_codex_ask_is_a_deny_that_says_a_human_must_approve(
    codex: Path, daemon: Daemon, tmp_path: Path
) -> None:
    one_call(codex, tmp_path).refuses_an_ask(daemon, tmp_path / "ran.txt")


def test_real_codex_with_the_daemon_down(codex: Path, tmp_path: Path) -> None:
    one_call(codex, tmp_path).follows_the_fail_mode_with_the_daemon_down(tmp_path / "ran.txt")


def test_real_codex_unreadable_input(codex: Path, tmp_path: Path) -> None:
    one_call(codex, tmp_path).follows_the_fail_mode_on_unreadable_input(tmp_path / "ran.txt")
