"""Cursor's hook contract (ratewarden.hooks.cursor): payloads as Cursor's agent runtime
(`@cursor/sdk` 1.0.32) builds them, refusals as its hook runner reads them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ratewarden.hooks import cursor
from ratewarden.hooks.contract import BadInput, PostCall, PreCall
from ratewarden.hooks.hosts import HOSTS, SUMMARIES
from ratewarden.vocabulary import DecisionName

BASE = {
    "conversation_id": "c0ffee00-1111-4222-8333-444455556666",
    "generation_id": "9e1f7a52-0b1c-4d2e-8f3a-5b6c7d8e9f00",
    "model": "claude-4.5-sonnet",
    "session_id": "c0ffee00-1111-4222-8333-444455556666",
    "cursor_version": "3.21.16",
    "workspace_roots": ["/work"],
    "user_email": "carol@example.com",
    "transcript_path": None,
}
PRE = {
    **BASE,
    "hook_event_name": "preToolUse",
    "tool_name": "Shell",
    "tool_input": {"command": "echo ran >> ran.txt", "cwd": "/work"},
    "tool_use_id": "toolu_01ABCDEF",
    "cwd": "/work",
}
POST = {**PRE, "hook_event_name": "postToolUse", "tool_output": "{}", "duration": 12.5}
FAILED = {
    **PRE,
    "hook_event_name": "postToolUseFailure",
    "error_message": "exit 1",
    "failure_type": "error",
    "duration": 3.0,
    "is_interrupt": False,
}


def read(payload: dict[str, Any]) -> object:
    return cursor.read(json.dumps(payload).encode(), {})


def test_registered() -> None:
    assert HOSTS["cursor"] is cursor.HOST
    assert "cursor" in SUMMARIES
    assert cursor.HOST.http is None


def test_pre_tool_use_is_a_call_about_to_run_by_the_signed_in_user() -> None:
    call = read(PRE)
    assert isinstance(call, PreCall)
    assert (call.tool, call.session, call.user, call.args) == (
        "Shell",
        BASE["session_id"],
        "carol@example.com",  # the daemon's user when the hook has no --user
        {"command": "echo ran >> ran.txt", "cwd": "/work"},
    )
    assert call.call_id is not None
    assert call.call_id.startswith("toolu_01ABCDEF~")


@pytest.mark.parametrize("email", [None, "", 3, "x" * 300])
def test_no_usable_email_is_no_user(email: object) -> None:
    call = read({**PRE, "user_email": email})
    assert isinstance(call, PreCall)
    assert call.user is None


def test_the_session_falls_back_to_the_conversation() -> None:
    payload = {key: value for key, value in PRE.items() if key != "session_id"}
    call = read(payload)
    assert isinstance(call, PreCall)
    assert call.session == BASE["conversation_id"]


def test_post_tool_use_settles_the_same_call_with_its_duration() -> None:
    pre, post = read(PRE), read(POST)
    assert isinstance(pre, PreCall)
    assert isinstance(post, PostCall)
    assert (post.call_id, post.status, post.duration_ms, post.cost) == (
        pre.call_id,
        "ok",
        12.5,
        None,
    )


def test_a_failed_call_settles_as_an_error() -> None:
    post = read(FAILED)
    assert isinstance(post, PostCall)
    assert (post.status, post.duration_ms, post.cost) == ("error", 3.0, None)


def test_a_call_a_hook_refused_never_ran_and_costs_nothing() -> None:
    post = read({**FAILED, "failure_type": "permission_denied", "duration": 0})
    assert isinstance(post, PostCall)
    assert (post.status, post.cost) == ("blocked", 0.0)


def test_the_same_model_call_id_in_another_conversation_is_another_call() -> None:
    other = read({**PRE, "session_id": "s2", "conversation_id": "s2"})
    assert isinstance(other, PreCall)
    assert other.call_id != read(PRE).call_id  # type: ignore[attr-defined]


def test_before_shell_execution_is_a_shell_call_without_an_id() -> None:
    payload = {**BASE, "hook_event_name": "beforeShellExecution", "command": "ls", "cwd": "/w"}
    call = read(payload)
    assert isinstance(call, PreCall)
    assert (call.tool, call.call_id, call.args, call.user) == (
        "Shell",
        None,
        {"command": "ls"},
        "carol@example.com",
    )


def test_before_mcp_execution_is_the_mcp_tool() -> None:
    payload = {
        **BASE,
        "hook_event_name": "beforeMCPExecution",
        "tool_name": "create_issue",
        "tool_input": '{"title": "x"}',
        "command": "npx github-mcp",
    }
    call = read(payload)
    assert isinstance(call, PreCall)
    assert (call.tool, call.args) == (
        "create_issue",
        '{"title": "x"}',
    )


@pytest.mark.parametrize(
    "event", ["afterShellExecution", "afterMCPExecution", "beforeReadFile", "stop", "sessionStart"]
)
def test_other_events_are_nothing_to_do(event: str) -> None:
    assert read({**PRE, "hook_event_name": event}) is None


def test_a_finished_call_without_an_id_is_nothing_to_do() -> None:
    assert read({k: v for k, v in POST.items() if k != "tool_use_id"}) is None


@pytest.mark.parametrize(
    "payload",
    [b"", b"{", b"null", json.dumps({**PRE, "hook_event_name": ""}).encode(),
     json.dumps({**PRE, "tool_name": None}).encode()],
)  # fmt: skip
def test_unreadable_input(payload: bytes) -> None:
    with pytest.raises(BadInput):
        cursor.read(payload, {})


@pytest.mark.parametrize("decision", ["deny", "ask"])
def test_a_refusal_is_a_permission_with_the_message_for_user_and_model(
    decision: DecisionName,
) -> None:
    output = cursor.refuse(decision, "Rate limit: max 10 terminal calls per minute")
    assert output.code == 0
    assert output.stderr == ()
    message = "Rate limit: max 10 terminal calls per minute"
    assert json.loads(output.stdout) == {
        "permission": decision,  # ask: Cursor's own approval prompt
        "user_message": message,
        "agent_message": message,
    }


def test_a_refusal_always_has_a_message() -> None:
    assert json.loads(cursor.refuse("ask", "").stdout)["agent_message"] == "ask by ratewarden"


def test_unreadable_input_failing_closed_denies_and_open_exits_1() -> None:
    output = cursor.refuse_unreadable("Tool guard unavailable: ...")
    assert output.code == 0
    assert json.loads(output.stdout)["permission"] == "deny"
    assert cursor.HOST.unreadable_open_code == 1  # a failed hook: Cursor runs the call
