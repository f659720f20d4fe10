"""Codex CLI's hook contract (ratewarden.hooks.codex): payloads as Codex 0.169.0 writes
them (its pre-tool-use.command.input schema), refusals as it reads them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ratewarden import vocabulary
from ratewarden.hooks import codex
from ratewarden.hooks.contract import BadInput, PostCall, PreCall
from ratewarden.hooks.hosts import HOSTS, SUMMARIES

PRE = {
    "session_id": "01a20fa4-b660-7922-a51a-a9deae433ae4",
    "turn_id": "01a20fa4-b676-70b1-9fe5-66c1e98ff7cd",
    "transcript_path": None,
    "cwd": "/work",
    "hook_event_name": "PreToolUse",
    "model": "gpt-5",
    "permission_mode": "bypassPermissions",
    "tool_name": "Bash",
    "tool_input": {"command": "echo ran >> ran.txt"},
    "tool_use_id": "call_a61fcaf1ce04",
}
POST = {**PRE, "hook_event_name": "PostToolUse", "tool_response": ""}


def read(payload: dict[str, Any] | bytes) -> object:
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return codex.read(raw, {})


def test_registered() -> None:
    assert HOSTS["codex"] is codex.HOST
    assert "codex" in SUMMARIES
    assert codex.HOST.http is None  # Codex has command hooks only


def test_pre_tool_use_is_a_call_about_to_run() -> None:
    call = read(PRE)
    assert isinstance(call, PreCall)
    assert (call.tool, call.session, call.args, call.user) == (
        "Bash",
        PRE["session_id"],
        {"command": "echo ran >> ran.txt"},
        None,
    )
    assert call.call_id is not None
    assert call.call_id.startswith("call_a61fcaf1ce04~")


def test_post_tool_use_settles_the_same_call() -> None:
    pre, post = read(PRE), read(POST)
    assert isinstance(pre, PreCall)
    assert isinstance(post, PostCall)
    assert post.call_id == pre.call_id
    assert (post.status, post.duration_ms, post.cost) == (None, None, None)


def test_a_reused_model_call_id_is_another_call_in_another_turn_or_session() -> None:
    ids = {
        read({**PRE, "tool_use_id": "call_0", **changed}).call_id  # type: ignore[union-attr]
        for changed in ({}, {"turn_id": "t2"}, {"session_id": "s2"})
    }
    assert len(ids) == 3
    assert all(found.startswith("call_0~") for found in ids)


def test_a_call_without_session_and_turn_keeps_its_id() -> None:
    payload = {key: value for key, value in PRE.items() if key not in ("session_id", "turn_id")}
    assert read(payload).call_id == "call_a61fcaf1ce04"  # type: ignore[union-attr]


@pytest.mark.parametrize("event", ["SessionStart", "PermissionRequest", "Stop", "UserPromptSubmit"])
def test_other_events_are_nothing_to_do(event: str) -> None:
    assert read({**PRE, "hook_event_name": event}) is None


def test_post_tool_use_without_an_id_is_nothing_to_do() -> None:
    assert read({k: v for k, v in POST.items() if k != "tool_use_id"}) is None


@pytest.mark.parametrize(
    "payload",
    [b"not json", b"[1, 2]", json.dumps({**PRE, "hook_event_name": None}).encode(),
     json.dumps({**PRE, "tool_name": ""}).encode()],
)  # fmt: skip
def test_unreadable_input(payload: bytes) -> None:
    with pytest.raises(BadInput):
        codex.read(payload, {})


def test_deny_is_a_pre_tool_use_permission_decision() -> None:
    output = codex.refuse("deny", "Rate limit: max 10 terminal calls per minute")
    assert output.code == 0
    assert output.stderr == ()
    assert json.loads(output.stdout) == {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": "Rate limit: max 10 terminal calls per minute",
        }
    }


def test_ask_is_a_deny_that_says_a_human_must_approve() -> None:
    # Codex takes permissionDecision "ask" as unsupported and runs the call.
    output = json.loads(codex.refuse("ask", "Needs a look.").stdout)["hookSpecificOutput"]
    assert output["permissionDecision"] == "deny"
    assert output["permissionDecisionReason"] == vocabulary.needs_approval("Needs a look.")
    assert vocabulary.APPROVAL_NEEDED in output["permissionDecisionReason"]


def test_a_refusal_always_has_a_reason() -> None:
    # Codex rejects a deny without a non-empty permissionDecisionReason.
    output = json.loads(codex.refuse("deny", "").stdout)["hookSpecificOutput"]
    assert output["permissionDecisionReason"] == "deny by ratewarden"


def test_unreadable_input_failing_closed_blocks_with_exit_2_and_open_exits_1() -> None:
    output = codex.refuse_unreadable("Tool guard unavailable: ...")
    assert (output.code, output.stdout, output.stderr) == (2, "", ("Tool guard unavailable: ...",))
    assert codex.HOST.unreadable_open_code == 1  # a failed hook: Codex runs the call
