"""Issue 15 item 8: no payload makes a hook or an adapter fail open while the daemon is up.

A host's tool-call id with a control character, or a tool or user name longer than the
API takes, used to fail validation inside the hook, which then answered by its fail mode:
failing open, the tool ran unchecked even for a user already over the limit. Now every
check is built by `ratewarden.wire.names`: such names are mapped to valid ones
(the same name to the same counter), unusable ids replaced.

The hooks run as the hosts run them (a real `ratewarden hook` process, a real `ratewarden
serve`); the in-process adapters ask the same daemon, with their framework's return types
stood in where the framework is not installed in this venv. The tests import `names`
where they use it, so that before it existed the hook tests still fail for their own
reason (the hook failing open), not at import.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import unicodedata
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter

from ratewarden.client import AsyncGuard, Guard
from ratewarden.wire.bodies import CallId, CheckRequest, Subject
from tests.helpers.sdk_stand_ins import (
    ToolContext,
    ToolDecision,
    ToolGuardrail,
    ToolGuardrailFunctionOutput,
    ToolPermissionResult,
    stand_in,
)
from tests.hosts.scenario import Daemon, clean_environment, daemon_fixture, new_user, read_denials

RATEWARDEN = Path(sys.executable).with_name("ratewarden")  # the installed console script
POLICY = """\
version: 1
rules:
  - name: one-per-minute            # every tool, so an odd tool name cannot escape it
    match: {user: "over-*"}
    per: [user]
    rate: 1/minute
  - name: one-per-tool              # a counter per (user, tool)
    match: {user: "tools-*"}
    per: [user, tool]
    rate: 1/minute
  - name: one-task-at-a-time        # needs the post hook to settle the call
    match: {user: "slot-*", tool: "Task*"}
    per: [user]
    concurrency: 1
"""
LONG = 300  # past the API's 256 characters for a name and 128 for a call id
SUBJECT: TypeAdapter[str] = TypeAdapter(Subject)
CALL_ID: TypeAdapter[str] = TypeAdapter(CallId)


daemon = daemon_fixture(POLICY, scope="module")


def denials(daemon: Daemon, user: str) -> list[dict[str, Any]]:
    return read_denials(daemon.url, user)


# -- the hooks, as their hosts run them -----------------------------------------------------


def claude(daemon: Daemon, user: str, tool: str, call_id: str, event: str = "PreToolUse") -> str:
    """Claude Code's decision: "deny" (exit 0 + JSON), "allow" (exit 0, silent) or what ran."""
    payload = {
        "session_id": "sess-1",
        "transcript_path": "/tmp/t.jsonl",
        "cwd": "/tmp",
        "permission_mode": "default",
        "hook_event_name": event,
        "tool_name": tool,
        "tool_input": {"command": "ls"},
        "tool_use_id": call_id,
    }
    done = run_hook("claude-code", json.dumps(payload), daemon, user)
    if done.returncode == 0 and done.stdout:
        return str(json.loads(done.stdout)["hookSpecificOutput"]["permissionDecision"])
    return outcome(done)


def hermes(daemon: Daemon, user: str, tool: str, call_id: str, event: str = "pre_tool_call") -> str:
    """hermes' shell hook: "deny" is exit 0 + {"action": "block"}."""
    payload = {
        "hook_event_name": event,
        "tool_name": tool,
        "tool_input": {"command": "ls"},
        "session_id": "sess-h",
        "cwd": "/tmp",
        "extra": {"tool_call_id": call_id, "api_request_id": "r:api:1", "status": "ok"},
    }
    done = run_hook("hermes", json.dumps(payload), daemon, user)
    if done.returncode == 0 and done.stdout:
        return "deny" if json.loads(done.stdout)["action"] == "block" else done.stdout
    return outcome(done)


def agent_code(daemon: Daemon, user: str, tool: str, call_id: str) -> str:
    """agent-code spawns `bash -c` with the tool in AGENT_CODE_HOOK_TOOL: deny is exit 1
    with the reason as the one stderr line. It names no call id, so `call_id` is unused."""
    command = (
        f"{shlex.quote(str(RATEWARDEN))} hook agent-code --url {daemon.url} "
        f"--user {shlex.quote(user)}"
    )
    env = clean_environment(AGENT_CODE_HOOK_EVENT="pre_tool_use", AGENT_CODE_HOOK_TOOL=tool)
    done = subprocess.run(
        ["bash", "-c", command],
        input='{"command": "ls"}\n',
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )
    if done.returncode == 1 and done.stderr.strip() and "\n" not in done.stderr.strip():
        return "deny"
    return outcome(done)


def run_hook(host: str, stdin: str, daemon: Daemon, user: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(RATEWARDEN), "hook", host, "--url", daemon.url, "--user", user],
        input=stdin,
        capture_output=True,
        text=True,
        env=clean_environment(),
        timeout=30,
        check=False,
    )


def outcome(done: subprocess.CompletedProcess[str]) -> str:
    if (done.returncode, done.stdout, done.stderr) == (0, "", ""):  # no "failing open" note
        return "allow"
    return f"exit {done.returncode}: {done.stdout!r} {done.stderr!r}"  # shown on failure


HOOKS = {"claude-code": claude, "agent-code": agent_code, "hermes": hermes}
# Control characters each host can carry: an environment variable or argument (the
# agent-code tool, every host's --user) cannot hold NUL.
CONTROL = {"claude-code": "\x00\n\x7f", "agent-code": "\x01\t\x1b[31m", "hermes": "\x00\n\x7f"}
ARGV_CONTROL = CONTROL["agent-code"]


@pytest.mark.parametrize("host", list(HOOKS))
def test_hole8_no_payload_makes_a_hook_fail_open(daemon: Daemon, host: str) -> None:
    ask = HOOKS[host]
    control = CONTROL[host]
    user = new_user("over")
    assert ask(daemon, user, "Bash", f"toolu_{user}_0") == "allow"
    # The user is over the limit now: whatever else the payload says, the call is denied.
    odd: dict[str, tuple[str, str]] = {
        "a tool name of 300 characters": ("T" * LONG, f"toolu_{user}_1"),
        "a tool name with control characters": (f"Ba{control}sh", f"toolu_{user}_2"),
    }
    if host != "agent-code":  # the hosts whose payload names the call
        odd |= {
            "a call id with control characters": ("Bash", f"toolu_{control}{user}"),
            "a call id of 300 characters": ("Bash", f"toolu_{user}_" + "9" * LONG),
            "a tool name with a lone surrogate": ("\ud800", f"toolu_{user}_4"),  # JSON \ud800
            "a call id of a dot segment": ("Bash", ".."),
        }
    for what, (tool, call_id) in odd.items():
        assert ask(daemon, user, tool, call_id) == "deny", what
    # User names from --user: a long one is counted under one name, never a free pass,
    # and one sharing its first 256 characters has a counter of its own.
    for who in (f"{user}-" + "u" * LONG, f"{user}-" + "u" * (LONG - 1) + "v", user + ARGV_CONTROL):
        assert ask(daemon, who, "Bash", f"toolu_{uuid.uuid4().hex}") == "allow", who
        assert ask(daemon, who, "Bash", f"toolu_{uuid.uuid4().hex}") == "deny", who


@pytest.mark.parametrize("host", ["claude-code", "agent-code"])
def test_hole8_long_tool_names_keep_counters_of_their_own(daemon: Daemon, host: str) -> None:
    ask = HOOKS[host]
    user = new_user("tools")
    first, twin = "mcp__" + "a" * LONG, "mcp__" + "a" * (LONG - 1) + "b"
    assert ask(daemon, user, first, f"{user}_a1") == "allow"
    assert ask(daemon, user, first, f"{user}_a2") == "deny"  # the same name, the same counter
    assert ask(daemon, user, twin, f"{user}_b1") == "allow"  # same prefix, another counter
    assert ask(daemon, user, twin, f"{user}_b2") == "deny"


@pytest.mark.parametrize("host", ["claude-code", "hermes"])
def test_hole8_an_unusable_call_id_is_still_settled_by_the_post_hook(
    daemon: Daemon, host: str
) -> None:
    ask = HOOKS[host]
    user = new_user("slot")
    first, second, third = (f"toolu_\x00{user}", f"toolu_{user}" + "2" * LONG, f"{user}\n3")
    assert ask(daemon, user, "Task", first) == "allow"
    assert ask(daemon, user, "Task", second) == "deny"  # one Task at a time
    if host == "claude-code":
        settled = claude(daemon, user, "Task", first, event="PostToolUse")
    else:
        settled = hermes(daemon, user, "Task", first, event="post_tool_call")
    assert settled == "allow"  # exit 0, nothing printed: no "could not settle"
    assert ask(daemon, user, "Task", third) == "allow"  # the slot was released


# -- the in-process adapters ----------------------------------------------------------------

ODD_TOOL = "lookup_" + "t" * LONG
ODD_ID = "call\x00\n\u0085_7"  # NUL, newline and a C1 control


def assert_normalised(daemon: Daemon, user: str, lead: str) -> None:
    """The daemon saw the mapped tool name and a usable call id led by the host's id."""
    from ratewarden.wire import names

    [entry] = denials(daemon, user)
    assert entry["tool"] == names.subject(ODD_TOOL)
    assert CALL_ID.validate_python(entry["call_id"]) == entry["call_id"]
    assert entry["call_id"].startswith(lead)


def test_hole8_hermes_plugin_checks_odd_names(daemon: Daemon) -> None:
    from ratewarden.integrations.hermes import RatewardenPlugin

    user = new_user("over")
    plugin = RatewardenPlugin(guard=Guard(daemon.url), user=lambda hook: user)
    assert plugin.pre_tool_call(tool_name="terminal", tool_call_id="c0", session_id="s") is None
    blocked = plugin.pre_tool_call(tool_name=ODD_TOOL, tool_call_id=ODD_ID, session_id="s" * LONG)
    assert blocked is not None
    assert blocked["action"] == "block"
    assert blocked["message"].startswith("Rate limit: max 1")
    assert_normalised(daemon, user, "call_7~")
    from ratewarden.wire import names

    assert denials(daemon, user)[0]["session"] == names.subject("s" * LONG)
    plugin.guard.close()


async def test_hole8_strands_hook_checks_odd_names(daemon: Daemon) -> None:
    from ratewarden.integrations.strands import RatewardenHook

    def before(tool: str, use_id: str, user: str) -> Any:
        tool_use = {"name": tool, "toolUseId": use_id, "input": {}}
        state = {"user_id": user}
        return SimpleNamespace(
            cancel_tool=False, tool_use=tool_use, invocation_state=state, selected_tool=None
        )

    user = new_user("over")
    hook = RatewardenHook(guard=Guard(daemon.url))
    allowed = before("terminal", "tooluse_0", user)
    await hook.before_tool_call(allowed)
    assert allowed.cancel_tool is False
    odd = before(ODD_TOOL, ODD_ID, user)
    await hook.before_tool_call(odd)
    assert str(odd.cancel_tool).startswith("Rate limit: max 1")
    assert_normalised(daemon, user, "call_7~")
    hook.guard.close()


async def test_hole8_pydantic_ai_middleware_checks_odd_names(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in(
        monkeypatch,
        "pydantic_ai_middleware",
        ToolDecision=ToolDecision,
        ToolPermissionResult=ToolPermissionResult,
    )
    from ratewarden.integrations.pydantic_ai import RatewardenMiddleware

    user = new_user("over")
    guard = AsyncGuard(daemon.url)
    middleware = RatewardenMiddleware(guard)
    deps = {"user_id": user}
    first = await middleware.before_tool_call("terminal", {}, deps, SimpleNamespace())
    assert first.decision is ToolDecision.ALLOW
    odd = await middleware.before_tool_call(
        ODD_TOOL, {}, deps, SimpleNamespace(tool_call_id=ODD_ID)
    )
    assert odd.decision is ToolDecision.DENY
    assert odd.reason.startswith("Rate limit: max 1")
    assert_normalised(daemon, user, "call_7~")
    await guard.aclose()


async def test_hole8_openai_agents_guardrail_checks_odd_names(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    stand_in(
        monkeypatch,
        "agents",
        ToolGuardrailFunctionOutput=ToolGuardrailFunctionOutput,
        ToolInputGuardrail=ToolGuardrail,
    )
    from ratewarden.integrations.openai_agents import make_ratewarden_guardrail

    user = new_user("over")
    guard = AsyncGuard(daemon.url)
    check = make_ratewarden_guardrail(guard).guardrail_function

    def data(tool: str, call_id: str) -> Any:
        return SimpleNamespace(context=ToolContext(tool, call_id, {"user_id": user}))

    assert (await check(data("terminal", "call_0"))).allowed
    odd = await check(data(ODD_TOOL, ODD_ID))
    assert not odd.allowed
    assert odd.message.startswith("Rate limit: max 1")
    assert_normalised(daemon, user, "call_7~")
    await guard.aclose()


# -- the normaliser ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["Bash", "discord:1234", "x" * 256, "Émile 🙂", "mcp__github__create_issue", "a~b"]
)
def test_hole8_valid_names_are_sent_unchanged(name: str) -> None:
    from ratewarden.wire import names

    assert names.subject(name) == name


@pytest.mark.parametrize("call_id", ["toolu_01ABC", "c" * 128, "a/b", "%2F", "call 0", "x."])
def test_hole8_usable_call_ids_are_sent_unchanged(call_id: str) -> None:
    from ratewarden.wire import names

    assert names.usable_call_id(call_id) == call_id


@pytest.mark.parametrize(
    "name", ["x" * 257, "x" * 10_000, "a\x00b", "tab\there", "\x85", "\ud800", "", "é" * 300]
)
def test_hole8_other_names_map_to_a_prefix_and_a_digest(name: str) -> None:
    from ratewarden.wire import names

    mapped = names.subject(name)
    assert mapped != name
    assert mapped == names.subject(name)  # deterministic
    assert SUBJECT.validate_python(mapped) == mapped  # the API takes it
    mapped.encode("utf-8")  # and it can be sent
    prefix, digest = mapped.rsplit("~", 1)
    assert len(digest) == names.DIGEST_CHARS
    sendable = "".join(c for c in name if unicodedata.category(c) not in ("Cc", "Cs"))
    assert sendable.startswith(prefix)  # the name's start, control characters left out
    assert names.subject(mapped) == mapped  # a mapped name stays itself


def test_hole8_long_names_with_one_prefix_map_apart() -> None:
    from ratewarden.wire import names

    base = "x" * 300
    variants = [base, base + "y", "x" * 299 + "y", "x" * 257, base.replace("x", "X", 1)]
    mapped = {names.subject(v) for v in variants}
    assert len(mapped) == len(variants)
    assert all(len(m) == names.MAX_SUBJECT for m in mapped)
    # Control characters are left out of the prefix, not out of the digest.
    assert names.subject("a\x00b") != names.subject("a\x01b")
    assert names.subject("a\x00b") != "ab"


@pytest.mark.parametrize("call_id", [".", "..", "c\x00", "c\n", "c" * 129, "", "\udfff"])
def test_hole8_unusable_call_ids_are_replaced_the_same_way_each_time(call_id: str) -> None:
    from ratewarden.wire import names

    replaced = names.usable_call_id(call_id)
    assert replaced == names.usable_call_id(call_id)  # the post hook finds its check
    assert replaced not in (".", "..")
    assert CALL_ID.validate_python(replaced) == replaced
    assert len(replaced) <= names.MAX_CALL_ID


def test_hole8_fresh_call_ids_drop_what_the_api_refuses() -> None:
    from ratewarden import vocabulary

    first = vocabulary.call_id("host", "call\x00\n" + "9" * 300)
    second = vocabulary.call_id("host", "call\x00\n" + "9" * 300)
    assert first != second  # each check its own call
    for made in (first, second):
        assert CALL_ID.validate_python(made) == made
        assert made.startswith("call999")
        assert len(made) == vocabulary.MAX_CALL_ID
    assert vocabulary.call_id("host", "\x00").startswith("host~")


@given(st.text(max_size=400), st.text(max_size=400))
def test_hole8_any_text_becomes_a_name_the_api_takes(name: str, other: str) -> None:
    from ratewarden.wire import names

    mapped = names.subject(name)
    assert SUBJECT.validate_python(mapped) == mapped
    mapped.encode("utf-8")
    assert name == other or names.subject(other) != mapped
    request = names.check_request(user=name, tool=other, session=name, team=other, call_id=name)
    assert CheckRequest.model_validate_json(request.model_dump_json()) == request
