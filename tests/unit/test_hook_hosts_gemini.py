"""Gemini CLI's hook contract (ratewarden.hooks.gemini): payloads as Gemini CLI 0.61.0
writes them (its hookEventHandler), refusals as it reads them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ratewarden import vocabulary
from ratewarden.hooks import gemini
from ratewarden.hooks.contract import BadInput, ModelCall, ModelDone, PreCall
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


@pytest.mark.parametrize("event", ["AfterTool", "BeforeAgent", "SessionStart"])
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


# -- model calls (BeforeModel, AfterModel) ---------------------------------------------------

REQUEST = {
    "model": "gemini-2.5-pro",
    "messages": [
        {"role": "user", "content": "x" * 40},
        {"role": "model", "content": "y" * 3},
        {"role": "user", "parts": ["not a content string: not counted"]},
    ],
    "config": {"temperature": 1, "maxOutputTokens": 2048},
}
BEFORE_MODEL = {**BEFORE, "hook_event_name": "BeforeModel", "llm_request": REQUEST}
BEFORE_MODEL.pop("tool_name")
BEFORE_MODEL.pop("tool_input")


def after_model(finish: str | None, usage: Any) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": ["hi"]}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    response = {"text": "hi", "candidates": [candidate], "usageMetadata": usage}
    return {**BEFORE_MODEL, "hook_event_name": "AfterModel", "llm_response": response}


def test_before_model_is_a_model_call() -> None:
    call = read(BEFORE_MODEL)
    assert call == ModelCall("gemini-2.5-pro", BEFORE["session_id"], 11, 2048)  # 43 chars


@pytest.mark.parametrize("limit", [None, 0, -5, True, "8000", 1.5])
def test_a_missing_or_odd_output_limit_is_the_policys(limit: object) -> None:
    request = {**REQUEST, "config": {"maxOutputTokens": limit}}
    call = read({**BEFORE_MODEL, "llm_request": request})
    assert isinstance(call, ModelCall)
    assert call.max_output_tokens is None


@pytest.mark.parametrize("request_", [None, {}, {"model": ""}, {"model": 7}, "gemini"])
def test_a_model_call_without_a_model_is_unreadable(request_: object) -> None:
    with pytest.raises(BadInput, match="no model"):
        read({**BEFORE_MODEL, "llm_request": request_})


def test_only_the_chunk_that_ends_the_answer_settles() -> None:
    usage = {"promptTokenCount": 100, "candidatesTokenCount": 20, "totalTokenCount": 150}
    assert read(after_model(None, {"promptTokenCount": 100})) is None  # a chunk mid-answer
    done = read(after_model("STOP", usage))
    assert isinstance(done, ModelDone)
    assert (done.model, done.session) == ("gemini-2.5-pro", BEFORE["session_id"])
    # Output: the total less the prompt (thinking tokens are billed as output).
    assert done.usage == {"input_tokens": 100, "output_tokens": 50, "cache_read_tokens": 0}
    cached = read(after_model("MAX_TOKENS", {**usage, "cachedContentTokenCount": 400}))
    assert isinstance(cached, ModelDone)
    assert cached.usage is not None
    assert cached.usage["cache_read_tokens"] == 100  # never more than the prompt


def test_an_ended_answer_without_usage_settles_without_it() -> None:
    done = read(after_model("STOP", None))
    assert isinstance(done, ModelDone)
    assert done.usage is None  # the daemon charges the reservation


def test_hostile_usage_counts_nothing() -> None:
    usage = {"promptTokenCount": -1, "candidatesTokenCount": True, "totalTokenCount": "9"}
    done = read(after_model("STOP", usage))
    assert isinstance(done, ModelDone)
    assert done.usage == {"input_tokens": 0, "output_tokens": 0, "cache_read_tokens": 0}


@pytest.mark.parametrize("decision", ["deny", "ask"])
def test_a_refused_model_call_is_a_deny_with_the_sentence_as_the_answer(decision: str) -> None:
    output = gemini.refuse_model(decision, "This model call could cost up to 0.12 USD")  # type: ignore[arg-type]
    answer = json.loads(output.stdout)
    assert output.code == 0
    assert answer["decision"] == "deny"
    assert answer["reason"].startswith("This model call could cost up to 0.12 USD")
    synthetic = answer["hookSpecificOutput"]["llm_response"]
    assert synthetic["candidates"][0]["content"]["parts"] == [answer["reason"]]
    if decision == "ask":
        assert vocabulary.needs_approval("x").removeprefix("x") in answer["reason"]


def test_counts_past_the_wires_cap_are_the_cap() -> None:
    """A prompt padded past what the daemon takes is reserved at the cap, not refused
    by the daemon (which, failing open, would let it through unjudged)."""
    huge = vocabulary.MAX_TOKENS * 10
    request = {**REQUEST, "config": {"maxOutputTokens": huge}}
    call = read({**BEFORE_MODEL, "llm_request": request})
    assert isinstance(call, ModelCall)
    assert call.max_output_tokens == vocabulary.MAX_TOKENS
    usage = {"promptTokenCount": huge, "candidatesTokenCount": huge, "totalTokenCount": huge}
    done = read(after_model("STOP", usage))
    assert isinstance(done, ModelDone)
    assert done.usage is not None
    assert done.usage["input_tokens"] == vocabulary.MAX_TOKENS
    assert done.usage["output_tokens"] == vocabulary.MAX_TOKENS
