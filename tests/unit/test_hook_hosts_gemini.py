"""Gemini CLI's hook contract (ratewarden.hooks.gemini): payloads as Gemini CLI 0.61.0
writes them (its hookEventHandler), refusals as it reads them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ratewarden import vocabulary
from ratewarden.hooks import gemini
from ratewarden.hooks.contract import BadInput, PreCall
from ratewarden.hooks.hosts import HOSTS, SUMMARIES

BEFORE: dict[str, Any] = {
    "session_id": "cc3da635-db58-4b8d-bc99-76349c169c26",
    "transcript_path": "/home/u/.gemini/tmp/work/chats/session.jsonl",
    "cwd": "/work",
    "hook_event_name": "BeforeTool",
    "timestamp": "2026-11-24T22:22:40.555Z",
    "tool_name": "run_shell_command",
    "tool_input": {"command": "echo ran >> ran.txt", "description": "append"},
}
AFTER = {
    **BEFORE,
    "hook_event_name": "AfterTool",
    "tool_response": {"llmContent": "Output: (empty)", "returnDisplay": ""},
}


def read(payload: dict[str, Any]) -> object:
    return gemini.read(json.dumps(payload).encode(), {})


def test_registered() -> None:
    assert HOSTS["gemini"] is gemini.HOST
    assert "gemini" in SUMMARIES
    assert gemini.HOST.http is None


def test_before_tool_is_a_call_about_to_run() -> None:
    call = read(BEFORE)
    expected = PreCall("run_shell_command", BEFORE["session_id"], args=BEFORE["tool_input"])
    assert call == expected
    assert isinstance(call, PreCall)
    assert call.args == BEFORE["tool_input"]
    assert call.call_id is None  # Gemini names no call


def test_an_mcp_tool_keeps_its_name() -> None:
    call = read({**BEFORE, "tool_name": "mcp_github_create_issue", "mcp_context": {}})
    assert isinstance(call, PreCall)
    assert call.tool == "mcp_github_create_issue"


@pytest.mark.parametrize("event", ["AfterTool", "BeforeAgent", "SessionStart", "BeforeModel"])
def test_other_events_are_nothing_to_do(event: str) -> None:
    # AfterTool names no call, so there is nothing to settle.
    assert read({**AFTER, "hook_event_name": event}) is None


@pytest.mark.parametrize(
    "payload",
    [b"", b"garbage", b'"BeforeTool"', json.dumps({"tool_name": "x"}).encode(),
     json.dumps({**BEFORE, "tool_name": 3}).encode()],
)  # fmt: skip
def test_unreadable_input(payload: bytes) -> None:
    with pytest.raises(BadInput):
        gemini.read(payload, {})


def test_deny_is_decision_deny_with_the_reason() -> None:
    output = gemini.refuse("deny", "Rate limit: max 10 terminal calls per minute")
    assert output.code == 0
    assert output.stderr == ()
    assert json.loads(output.stdout) == {
        "decision": "deny",
        "reason": "Rate limit: max 10 terminal calls per minute",
    }


def test_ask_is_a_deny_that_says_a_human_must_approve() -> None:
    output = json.loads(gemini.refuse("ask", "Needs a look").stdout)
    assert output == {"decision": "deny", "reason": vocabulary.needs_approval("Needs a look")}


def test_a_refusal_always_has_a_reason() -> None:
    assert json.loads(gemini.refuse("deny", "").stdout)["reason"] == "deny by ratewarden"


def test_unreadable_input_failing_closed_blocks_with_exit_2_and_open_exits_1() -> None:
    output = gemini.refuse_unreadable("Tool guard unavailable: ...")
    assert (output.code, output.stdout, output.stderr) == (2, "", ("Tool guard unavailable: ...",))
    assert gemini.HOST.unreadable_open_code == 1  # a warning: Gemini runs the call
