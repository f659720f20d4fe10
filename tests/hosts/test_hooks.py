"""`ratewarden hook claude-code | agent-code | hermes`, run as the hosts run them.

Every hook runs as a real process against a real `ratewarden serve`, fed the payload its
host documents: Claude Code and hermes write JSON on stdin; agent-code spawns
`bash -c "<command>"` with the tool's input on stdin and the event and tool in
AGENT_CODE_HOOK_* variables. Each test uses users of its own, so they share one daemon.
The real Claude Code CLI drives the same command in tests/hosts/test_host_claude_code.py.
"""

from __future__ import annotations

import json
import os
import pwd
import shlex
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from ratewarden.hooks.command import HookOptions, run
from ratewarden.hooks.hosts import HOSTS
from ratewarden.wire import names
from tests.hosts.scenario import (
    Daemon,
    clean_environment,
    daemon_fixture,
    new_user,
    nowhere,
    read_denials,
    running_daemon,
)

RATEWARDEN = Path(sys.executable).with_name("ratewarden")  # the installed console script
TERMINAL_MESSAGE = "Rate limit: max 10 terminal calls per minute"
PAUSED = "Tool guard unavailable; Bash calls are paused"  # the daemon unreachable, failing closed
POLICY = """\
version: 1
tools:
  Bash: {label: terminal}          # Claude Code's and agent-code's name for the terminal
rules:
  - name: terminal-per-minute
    match: {tool: [Bash, terminal]}
    per: [user]
    rate: 10/minute
  - name: one-task-at-a-time
    match: {tool: Task}
    per: [user]
    concurrency: 1
  - name: deploys-need-approval
    match: {tool: Deploy}
    per: [user]
    rate: 0/minute
    on_exceed: ask
"""


daemon = daemon_fixture(POLICY, scope="module")


def hook(
    host: str, payload: Any, *flags: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`ratewarden hook HOST FLAGS` with `payload` (JSON-encoded unless str) on stdin."""
    stdin = payload if isinstance(payload, str) else json.dumps(payload)
    return subprocess.run(
        [str(RATEWARDEN), "hook", host, *flags],
        input=stdin,
        capture_output=True,
        text=True,
        env=clean_environment(**(env or {})),
        timeout=30,
        check=False,
    )


def agent_code(
    command: str, event: str, tool: str, context: Any, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Spawn a hook exactly as agent-code does: `bash -c`, context JSON + newline on stdin."""
    context_json = json.dumps(context)
    hook_env = {"AGENT_CODE_HOOK_EVENT": event, "AGENT_CODE_HOOK_TOOL": tool}
    if len(context_json.encode()) <= 16 * 1024:  # larger contexts only travel on stdin
        hook_env["AGENT_CODE_HOOK_CONTEXT"] = context_json
    else:
        hook_env["AGENT_CODE_HOOK_CONTEXT_TRUNCATED"] = "1"
    hook_env.update(env or {})
    return subprocess.run(
        ["bash", "-c", command],
        input=context_json + "\n",
        capture_output=True,
        text=True,
        env=clean_environment(**hook_env),
        timeout=30,
        check=False,
    )


def claude_pre(tool: str, call_id: str, session: str = "sess-1") -> dict[str, Any]:
    """A PreToolUse payload as Claude Code 2.1 writes it."""
    return {
        "session_id": session,
        "transcript_path": "/tmp/transcript.jsonl",
        "cwd": "/tmp",
        "permission_mode": "default",
        "hook_event_name": "PreToolUse",
        "tool_name": tool,
        "tool_input": {"command": "ls", "description": "list files"},
        "tool_use_id": call_id,
    }


def claude_post(
    tool: str, call_id: str, event: str = "PostToolUse", session: str = "sess-1"
) -> dict[str, Any]:
    payload = claude_pre(tool, call_id, session) | {"hook_event_name": event, "duration_ms": 12}
    if event == "PostToolUse":
        payload["tool_response"] = {"stdout": "", "stderr": "", "interrupted": False}
    else:
        payload["error"] = "Exit code 1"
    return payload


def hermes_payload(
    event: str, tool: str, request_id: str, session: str = "sess-h", **extra: Any
) -> dict[str, Any]:
    """What hermes' agent/shell_hooks.py writes on stdin, for a model that calls every
    tool `call_0` (as some model servers do); `request_id` names the model response."""
    return {
        "hook_event_name": event,
        "tool_name": tool,
        "tool_input": {"command": "ls"},
        "session_id": session,
        "cwd": "/tmp",
        "extra": {
            "task_id": "",
            "tool_call_id": "call_0",
            "turn_id": "t-1",
            "api_request_id": f"{session}:task:{request_id}:api:1",
            "middleware_trace": [],
            **extra,
        },
    }


def used(daemon: Daemon, user: str, tool: str, rule: str) -> int | float:
    answer = httpx.get(
        f"{daemon.url}/v1/usage", params={"user": user, "tool": tool}, timeout=5
    ).json()
    [item] = [item for item in answer["limits"] if item["rule"] == rule]
    value: int | float = item["used"]
    return value


def denials(daemon: Daemon, user: str) -> list[dict[str, Any]]:
    return read_denials(daemon.url, user)


# -- Claude Code ---------------------------------------------------------------------------


def test_claude_code_denies_the_11th_bash_call_with_json(daemon: Daemon) -> None:
    user = new_user()
    flags = ("--url", daemon.url, "--user", user)
    for n in range(10):
        done = hook("claude-code", claude_pre("Bash", f"toolu_{user}_{n}"), *flags)
        # Allowed: nothing at all on stdout (an explicit "allow" would skip Claude Code's
        # own permission prompt), exit 0.
        assert (done.returncode, done.stdout, done.stderr) == (0, "", ""), n
    denied = hook("claude-code", claude_pre("Bash", f"toolu_{user}_10"), *flags)
    assert denied.returncode == 0  # exit 1 would not block; the JSON does
    answer = json.loads(denied.stdout)
    reason = answer["hookSpecificOutput"].pop("permissionDecisionReason")
    detail = answer.pop("systemMessage")  # the user's line: which rule counted what
    assert answer == {
        "hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny"}
    }
    assert detail.startswith("ratewarden: rule terminal-per-minute (rate) refused the call")
    assert f"user={user}: 10 of 10 used" in detail
    assert reason.startswith(TERMINAL_MESSAGE)
    assert used(daemon, user, "Bash", "terminal-per-minute") == 10
    # The session and the call id came from the payload.
    [entry] = denials(daemon, user)
    assert (entry["session"], entry["call_id"], entry["tool"], entry["host_tool"]) == (
        "sess-1",
        f"toolu_{user}_10",
        "terminal",  # the canonical name, and Claude Code's own beside it
        "Bash",
    )


def test_claude_code_post_tool_use_settles_the_call(daemon: Daemon) -> None:
    user = new_user()
    flags = ("--url", daemon.url, "--user", user)
    first = hook("claude-code", claude_pre("Task", "toolu_a-" + user), *flags)
    assert (first.returncode, first.stdout) == (0, "")
    # One Task at a time: while the first is in flight, a second is refused...
    second = hook("claude-code", claude_pre("Task", "toolu_b-" + user), *flags)
    reason = json.loads(second.stdout)["hookSpecificOutput"]["permissionDecisionReason"]
    assert reason == "Concurrency limit: max 1 delegate_task calls at once"  # Task is Claude Code's
    # ...and PostToolUse releases the slot (printing nothing).
    settled = hook("claude-code", claude_post("Task", "toolu_a-" + user), *flags)
    assert (settled.returncode, settled.stdout, settled.stderr) == (0, "", "")
    # Sequential pre/post pairs all pass only because each post settles its call;
    # PostToolUseFailure settles too.
    for n in range(4):
        call = f"toolu_{n}-{user}"
        pre = hook("claude-code", claude_pre("Task", call), *flags)
        assert (pre.returncode, pre.stdout) == (0, ""), n
        event = "PostToolUseFailure" if n % 2 else "PostToolUse"
        post = hook("claude-code", claude_post("Task", call, event), *flags)
        assert (post.returncode, post.stdout, post.stderr) == (0, "", ""), n
    assert used(daemon, user, "Task", "one-task-at-a-time") == 0


def test_claude_code_ask_becomes_a_permission_prompt(daemon: Daemon) -> None:
    user = new_user()
    done = hook(
        "claude-code", claude_pre("Deploy", "toolu_d-" + user), "--url", daemon.url, "--user", user
    )
    assert done.returncode == 0
    output = json.loads(done.stdout)["hookSpecificOutput"]
    assert output["permissionDecision"] == "ask"
    assert output["permissionDecisionReason"].startswith("Rate limit: max 0 Deploy calls")


def test_claude_code_ignores_other_events_and_unknown_calls(daemon: Daemon) -> None:
    user = new_user()
    flags = ("--url", daemon.url, "--user", user)
    prompt = {"session_id": "s", "hook_event_name": "UserPromptSubmit", "prompt": "hi"}
    done = hook("claude-code", prompt, *flags)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    # A call the daemon never saw (e.g. checked while the daemon was down): nothing to
    # settle, said on stderr, and still exit 0 (the tool already ran).
    done = hook("claude-code", claude_post("Bash", "toolu_never-" + user), *flags)
    assert (done.returncode, done.stdout) == (0, "")
    assert f"could not settle toolu_never-{user}" in done.stderr


def test_a_reused_call_id_is_no_free_pass(daemon: Daemon) -> None:
    # The daemon answers a call id it already allowed from its record, consuming nothing;
    # a host repeating an id must not get calls for free.
    user = new_user()
    flags = ("--url", daemon.url, "--user", user)
    first = hook("claude-code", claude_pre("Task", "toolu_same-" + user), *flags)
    assert (first.returncode, first.stdout, first.stderr) == (0, "", "")
    again = hook("claude-code", claude_pre("Task", "toolu_same-" + user), *flags)
    reason = json.loads(again.stdout)["hookSpecificOutput"]["permissionDecisionReason"]
    assert reason == "Concurrency limit: max 1 delegate_task calls at once"  # Task is Claude Code's
    assert f"call id toolu_same-{user} was already used" in again.stderr
    # An id another user's call holds (the daemon says 409) is counted as a new call too.
    other = new_user()
    taken = hook(
        "claude-code",
        claude_pre("Bash", "toolu_same-" + user),
        "--url",
        daemon.url,
        "--user",
        other,
    )
    assert (taken.returncode, taken.stdout) == (0, "")
    assert "was already used" in taken.stderr
    assert used(daemon, other, "Bash", "terminal-per-minute") == 1


def test_a_user_past_the_apis_limit_is_checked_under_a_mapped_name(daemon: Daemon) -> None:
    too_long = new_user() + "x" * 300  # the API takes 256 characters: mapped, not refused
    payload = claude_pre("Bash", "toolu_" + too_long[:16])
    done = hook("claude-code", payload, "--url", daemon.url, "--user", too_long)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert used(daemon, names.subject(too_long), "Bash", "terminal-per-minute") == 1


def test_a_daemon_refusing_the_check_follows_the_fail_mode(tmp_path: Path) -> None:
    # A 4xx other than a reused call id: here, a token the daemon does not know.
    payload = json.dumps(claude_pre("Bash", "toolu_1")).encode()
    with running_daemon(POLICY, tmp_path, "--api-token", "the-right-token") as guarded:
        wrong = HookOptions(url=guarded.url, token="a-wrong-token")
        opened = run(HOSTS["claude-code"], wrong, payload, {})
        closed = run(HOSTS["claude-code"], wrong._replace(fail="closed"), payload, {})
    assert (opened.code, opened.stdout) == (0, "")
    assert len(opened.stderr) == 1
    assert opened.stderr[0].startswith("ratewarden: the daemon refused the hook (401: ")
    assert opened.stderr[0].endswith("; failing open")
    output = json.loads(closed.stdout)["hookSpecificOutput"]
    assert (output["permissionDecision"], output["permissionDecisionReason"]) == ("deny", PAUSED)


# -- agent-code --------------------------------------------------------------------------


def test_agent_code_vetoes_the_11th_bash_call_with_one_stderr_line(daemon: Daemon) -> None:
    user = new_user()
    command = f"{shlex.quote(str(RATEWARDEN))} hook agent-code --url {daemon.url}"
    tool_input = {"command": "cargo test", "timeout": 120000}
    for n in range(10):
        done = agent_code(command, "pre_tool_use", "Bash", tool_input, {"RATEWARDEN_USER": user})
        assert (done.returncode, done.stdout, done.stderr) == (0, "", ""), n
    vetoed = agent_code(command, "pre_tool_use", "Bash", tool_input, {"RATEWARDEN_USER": user})
    assert vetoed.returncode == 1
    # agent-code shows the model "Blocked by pre-tool-use hook: <first stderr line>".
    first_line = vetoed.stderr.strip().splitlines()[0]
    assert first_line.startswith(TERMINAL_MESSAGE)
    assert vetoed.stderr.strip() == first_line
    assert used(daemon, user, "Bash", "terminal-per-minute") == 10
    # post_tool_use names no call, so there is nothing to settle: exit 0, silently.
    after = agent_code(
        command,
        "post_tool_use",
        "Bash",
        {"tool": "Bash", "is_error": False},
        {"RATEWARDEN_USER": user},
    )
    assert (after.returncode, after.stdout, after.stderr) == (0, "", "")


def test_agent_code_ask_is_a_veto_too(daemon: Daemon) -> None:
    command = (
        f"{shlex.quote(str(RATEWARDEN))} hook agent-code --url {daemon.url} --user {new_user()}"
    )
    done = agent_code(command, "pre_tool_use", "Deploy", {"target": "prod"})
    assert done.returncode == 3
    assert done.stderr.startswith("Rate limit: max 0 Deploy calls per minute")
    assert "A human must approve this call" in done.stderr  # agent-code asks no one


def test_agent_code_large_tool_input_is_read_whole(daemon: Daemon) -> None:
    # agent-code writes the whole context to stdin before waiting: the hook must drain it,
    # or a write of more than a pipe buffer would fail and veto the call.
    command = (
        f"{shlex.quote(str(RATEWARDEN))} hook agent-code --url {daemon.url} --user {new_user()}"
    )
    big = {"path": "a.txt", "content": "x" * 300_000}
    done = agent_code(command, "pre_tool_use", "FileWrite", big)
    assert (done.returncode, done.stderr) == (0, "")


# -- hermes shell hook ----------------------------------------------------------------------


def test_hermes_blocks_the_11th_terminal_call(daemon: Daemon) -> None:
    user = new_user()
    flags = ("--url", daemon.url)
    env = {"RATEWARDEN_USER": user}
    for n in range(10):
        payload = hermes_payload("pre_tool_call", "terminal", f"{user}-{n}")
        done = hook("hermes", payload, *flags, env=env)
        assert (done.returncode, done.stdout, done.stderr) == (0, "", ""), n
    payload = hermes_payload("pre_tool_call", "terminal", f"{user}-10")
    blocked = hook("hermes", payload, *flags, env=env)
    assert blocked.returncode == 0
    answer = json.loads(blocked.stdout)
    assert answer["action"] == "block"
    assert answer["message"].startswith(TERMINAL_MESSAGE)
    [entry] = denials(daemon, user)
    # Every call was `call_0`: each counted, told apart by hermes' api_request_id.
    assert entry["session"] == "sess-h"
    assert entry["call_id"].startswith("call_0~")  # vocabulary.call_id's one scheme


def test_hermes_post_tool_call_settles(daemon: Daemon) -> None:
    user = new_user()
    flags = ("--url", daemon.url, "--user", user)
    for n, status in enumerate(["ok", "error", "blocked", "ok"]):
        call = f"{user}-{n}"
        pre = hook("hermes", hermes_payload("pre_tool_call", "Task", call), *flags)
        assert (pre.returncode, pre.stdout) == (0, ""), n
        post = hermes_payload(
            "post_tool_call",
            "Task",
            call,
            status=status,
            duration_ms=5,
            result="{}",
            error_type=None,
            error_message=None,
        )
        done = hook("hermes", post, *flags)
        assert (done.returncode, done.stdout, done.stderr) == (0, "", ""), n
    assert used(daemon, user, "Task", "one-task-at-a-time") == 0


def test_hermes_ask_blocks(daemon: Daemon) -> None:
    payload = hermes_payload("pre_tool_call", "Deploy", "call_x-" + new_user())
    done = hook("hermes", payload, "--url", daemon.url, "--user", new_user())
    answer = json.loads(done.stdout)
    assert answer["action"] == "block"
    assert answer["message"].startswith("Rate limit: max 0 Deploy calls per minute")


# -- the daemon unreachable, for each host ---------------------------------------------------

PAYLOADS = {
    "claude-code": claude_pre("Bash", "toolu_down"),
    "hermes": hermes_payload("pre_tool_call", "Bash", "call_down"),
}


@pytest.mark.parametrize("host", ["claude-code", "hermes"])
def test_unreachable_daemon_fails_open_by_default(host: str) -> None:
    done = hook(host, PAYLOADS[host], "--url", nowhere(), "--timeout", "0.5")
    assert (done.returncode, done.stdout) == (0, "")
    assert "daemon unreachable" in done.stderr
    assert "failing open" in done.stderr


def test_unreachable_daemon_fails_closed_on_request_claude_code() -> None:
    done = hook("claude-code", PAYLOADS["claude-code"], "--url", nowhere(), "--fail", "closed")
    assert done.returncode == 0
    output = json.loads(done.stdout)["hookSpecificOutput"]
    assert (output["permissionDecision"], output["permissionDecisionReason"]) == ("deny", PAUSED)


def test_unreachable_daemon_fails_closed_on_request_hermes() -> None:
    done = hook("hermes", PAYLOADS["hermes"], "--url", nowhere(), "--fail", "closed")
    assert (done.returncode, json.loads(done.stdout)) == (
        0,
        {"action": "block", "message": PAUSED},
    )


def test_unreachable_daemon_agent_code() -> None:
    url = nowhere()
    opened = agent_code(f"{RATEWARDEN} hook agent-code --url {url}", "pre_tool_use", "Bash", {})
    assert opened.returncode == 0  # any non-zero exit would veto
    assert "failing open" in opened.stderr
    closed = agent_code(
        f"{RATEWARDEN} hook agent-code --url {url} --fail closed", "pre_tool_use", "Bash", {}
    )
    assert closed.returncode == 1
    assert closed.stderr.splitlines()[0] == PAUSED


def test_url_and_token_come_from_the_environment(daemon: Daemon) -> None:
    user = new_user()
    env = {"RATEWARDEN_URL": daemon.url, "RATEWARDEN_TOKEN": "unused", "RATEWARDEN_USER": user}
    done = hook("claude-code", claude_pre("Bash", "toolu_env-" + user), env=env)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert used(daemon, user, "Bash", "terminal-per-minute") == 1


# -- input the hook cannot read ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "payload"),
    [
        ("claude-code", "not json"),
        ("claude-code", "[1, 2]"),
        ("claude-code", '{"tool_name": "Bash"}'),
        ("claude-code", '{"hook_event_name": "PreToolUse", "tool_name": ""}'),
        ("hermes", ""),
        ("hermes", '{"hook_event_name": "pre_tool_call", "tool_name": null}'),
    ],
)
def test_unreadable_input_is_a_non_blocking_hook_error_failing_open(
    host: str, payload: str
) -> None:
    done = hook(host, payload, "--url", nowhere())
    # Claude Code and hermes report exit 1 as a failed hook and go on with the call.
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith("ratewarden: ")
    assert done.stderr.strip().endswith("failing open")


def test_unreadable_input_blocks_failing_closed() -> None:
    claude = hook("claude-code", "not json", "--url", nowhere(), "--fail", "closed")
    # Exit 2 is Claude Code's generic block: stderr goes to the model.
    assert (claude.returncode, claude.stdout) == (2, "")
    assert claude.stderr.startswith("Tool guard unavailable: cannot read the claude-code hook")
    hermes = hook("hermes", "not json", "--url", nowhere(), "--fail", "closed")
    answer = json.loads(hermes.stdout)
    assert answer["action"] == "block"
    assert answer["message"].startswith("Tool guard unavailable: cannot read the hermes hook")


def test_agent_code_without_its_environment() -> None:
    command = f"{RATEWARDEN} hook agent-code --url {nowhere()}"
    opened = subprocess.run(
        ["bash", "-c", command],
        input="{}\n",
        capture_output=True,
        text=True,
        env=clean_environment(),
        timeout=30,
        check=False,
    )
    assert opened.returncode == 0  # failing open: exit 0, since any other exit vetoes
    assert "AGENT_CODE_HOOK_EVENT is not set" in opened.stderr
    closed = subprocess.run(
        ["bash", "-c", command + " --fail closed"],
        input="{}\n",
        capture_output=True,
        text=True,
        env=clean_environment(),
        timeout=30,
        check=False,
    )
    assert closed.returncode == 1
    assert len(closed.stderr.splitlines()) == 1
    assert "AGENT_CODE_HOOK_EVENT is not set" in closed.stderr
    no_tool = agent_code(command + " --fail closed", "pre_tool_use", "", {})
    assert no_tool.returncode == 1
    assert "no tool name in AGENT_CODE_HOOK_TOOL" in no_tool.stderr


def test_events_without_work_need_no_daemon() -> None:
    # In-process: the payload readers alone, no daemon (nothing is asked for these).
    options = HookOptions(url=nowhere())
    quiet = [
        (HOSTS["claude-code"], b'{"hook_event_name": "Stop", "session_id": "s"}', {}),
        (HOSTS["claude-code"], b'{"hook_event_name": "PostToolUse", "tool_name": "Bash"}', {}),
        (HOSTS["hermes"], b'{"hook_event_name": "on_session_start", "extra": {}}', {}),
        (HOSTS["hermes"], b'{"hook_event_name": "post_tool_call", "tool_name": "x"}', {}),
        (HOSTS["agent-code"], b"{}\n", {"AGENT_CODE_HOOK_EVENT": "session_start"}),
        (HOSTS["agent-code"], b"{}\n", {"AGENT_CODE_HOOK_EVENT": "post_tool_use"}),
    ]
    for host, payload, environ in quiet:
        output = run(host, options, payload, environ)
        assert (output.code, output.stdout, output.stderr) == (0, "", ()), payload


# -- who is calling ----------------------------------------------------------------------------


def test_user_precedence_flag_then_environment_then_login(daemon: Daemon) -> None:
    flag_user, env_user, login_user = new_user("flag"), new_user("env"), new_user("login")
    rule = "terminal-per-minute"

    def pre(*flags: str, env: dict[str, str]) -> None:
        call = f"toolu_{uuid.uuid4().hex}"
        done = hook("claude-code", claude_pre("Bash", call), "--url", daemon.url, *flags, env=env)
        assert (done.returncode, done.stdout, done.stderr) == (0, "", "")

    # --user wins over RATEWARDEN_USER and the login name.
    pre("--user", flag_user, env={"RATEWARDEN_USER": env_user, "LOGNAME": login_user})
    assert used(daemon, flag_user, "Bash", rule) == 1
    assert used(daemon, env_user, "Bash", rule) == 0
    # RATEWARDEN_USER wins over the login name.
    pre(env={"RATEWARDEN_USER": env_user, "LOGNAME": login_user})
    assert used(daemon, env_user, "Bash", rule) == 1
    assert used(daemon, login_user, "Bash", rule) == 0
    # Else the OS login name, as getpass finds it (LOGNAME first).
    pre(env={"LOGNAME": login_user})
    assert used(daemon, login_user, "Bash", rule) == 1


def test_user_defaults_to_the_account_name(daemon: Daemon) -> None:
    # Without login variables, getpass falls back to the account of the process's uid.
    env = {
        k: v
        for k, v in clean_environment().items()
        if k not in ("LOGNAME", "USER", "LNAME", "USERNAME")
    }
    account = pwd.getpwuid(os.getuid()).pw_name
    before = used(daemon, account, "Bash", "terminal-per-minute")
    done = subprocess.run(
        [str(RATEWARDEN), "hook", "claude-code", "--url", daemon.url],
        input=json.dumps(claude_pre("Bash", f"toolu_{uuid.uuid4().hex}")),
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert used(daemon, account, "Bash", "terminal-per-minute") == before + 1


def test_hook_flags_are_checked() -> None:
    bad = hook("claude-code", "{}", "--timeout", "0")
    assert bad.returncode == 2
    assert "--timeout" in bad.stderr
    listed = subprocess.run(
        [str(RATEWARDEN), "hook", "--help"],
        capture_output=True,
        text=True,
        env=clean_environment(),
        timeout=30,
        check=False,
    )
    assert listed.returncode == 0
    for host in ("claude-code", "agent-code", "hermes"):
        assert host in listed.stdout
