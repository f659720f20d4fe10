"""Codex CLI's hook contract (ratewarden.hooks.codex): payloads as Codex 0.169.0 writes
them (its pre-tool-use.command.input schema), refusals as it reads them, and which call
a PostToolUse settles when the model reuses its call ids (the ledger, hooks/ledger.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ratewarden import vocabulary
from ratewarden.hooks import codex, command, ledger
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
        read({**PRE, "tool_use_id": "call_0", **changed}).call_id  # type: ignore[attr-defined]
        for changed in ({}, {"turn_id": "t2"}, {"session_id": "s2"})
    }
    assert len(ids) == 3
    assert all(found.startswith("call_0~") for found in ids)


def test_a_call_without_session_and_turn_keeps_its_id() -> None:
    payload = {key: value for key, value in PRE.items() if key not in ("session_id", "turn_id")}
    assert read(payload).call_id == "call_a61fcaf1ce04"  # type: ignore[attr-defined]


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


# -- pairing a PostToolUse with its PreToolUse (hooks/ledger.py) -------------------------


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    """A command hook's environment with a ledger folder."""
    return {"HOME": str(tmp_path)}


def ledger_files(home: dict[str, str]) -> list[str]:
    folder = Path(home["HOME"], ".cache", "ratewarden", "codex")
    return sorted(path.name for path in folder.iterdir()) if folder.exists() else []


def call(command: str = "echo ran >> ran.txt", **changed: str) -> dict[str, Any]:
    """A PreToolUse payload for model call id `call_0`, as a server that reuses it sends."""
    return {**PRE, "tool_use_id": "call_0", "tool_input": {"command": command}, **changed}


def opened(payload: dict[str, Any], home: dict[str, str]) -> str:
    """The PreToolUse read and, as if the daemon allowed it, opened: its call id."""
    pre = codex.read(json.dumps(payload).encode(), home)
    assert isinstance(pre, PreCall)
    assert pre.call_id is not None
    codex.opened(pre, home)
    return pre.call_id


def closed(payload: dict[str, Any], home: dict[str, str]) -> str:
    """The PostToolUse of that call: the call id it settles."""
    post = codex.read(json.dumps({**payload, "hook_event_name": "PostToolUse"}).encode(), home)
    assert isinstance(post, PostCall)
    return post.call_id


def test_ten_calls_reusing_call_0_are_ten_calls_each_closed_by_its_post(
    home: dict[str, str],
) -> None:
    ids = []
    for _ in range(10):
        ids.append(opened(call(), home))
        assert closed(call(), home) == ids[-1]
    assert len(set(ids)) == 10
    assert all(found.startswith("call_0~") for found in ids)
    assert ledger_files(home) == [".lock"]


def test_two_calls_open_at_once_are_closed_by_their_own_posts(home: dict[str, str]) -> None:
    first, second = opened(call("make a"), home), opened(call("make b"), home)
    assert closed(call("make a"), home) == first  # the older one first: found by its input
    assert closed(call("make b"), home) == second


def test_alike_calls_open_at_once_are_each_closed_once(home: dict[str, str]) -> None:
    # Same id, same input: interchangeable to every rule; each Post closes one of them.
    ids = {opened(call(), home), opened(call(), home)}
    assert {closed(call(), home), closed(call(), home)} == ids


def test_a_post_with_no_pre_kept_settles_the_derived_id_and_takes_no_other_call(
    home: dict[str, str],
) -> None:
    kept = opened(call("make a"), home)
    lone = call("make a", tool_use_id="call_1")  # another model id: nothing kept for it
    assert closed(lone, home) == codex.call_id(lone)  # the daemon answers "unknown": a note
    assert closed({**call("make a"), "tool_name": "apply_patch"}, home) != kept
    assert closed(call("make a"), home) == kept


def test_a_call_whose_input_another_hook_rewrote_is_found_by_its_model_id_and_tool(
    home: dict[str, str],
) -> None:
    # Codex takes a PreToolUse hook's `updatedInput`: its PostToolUse may carry the new
    # input. With the model's own ids (`call_abc...`) that still names one call.
    kept = opened(call("make", tool_use_id="call_abc"), home)
    assert closed(call("make -j4", tool_use_id="call_abc"), home) == kept


def test_a_call_the_daemon_did_not_allow_is_not_kept(home: dict[str, str]) -> None:
    # A refused call never runs, so no PostToolUse comes: nothing is kept for it.
    refused = codex.read(json.dumps(call()).encode(), home)
    assert isinstance(refused, PreCall)
    assert closed(call(), home) != refused.call_id
    assert ledger_files(home) in ([], [".lock"])


def test_sessions_reusing_ids_do_not_close_each_others_calls(home: dict[str, str]) -> None:
    mine = opened(call(session_id="s1"), home)
    theirs = opened(call(session_id="s2"), home)
    assert closed(call(session_id="s2"), home) == theirs
    assert closed(call(session_id="s1"), home) == mine


def test_a_subagents_call_is_paired_like_any_other(home: dict[str, str]) -> None:
    sub = {"agent_id": "a1", "agent_type": "worker"}
    kept = opened(call(**sub), home)
    assert closed(call(**sub), home) == kept


def test_a_ledger_it_cannot_write_leaves_the_call_to_its_lease(
    home: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ledger, "keep", full)
    monkeypatch.setattr(command, "_post", lambda *args: {"decision": "allow"})
    payload = json.dumps(call()).encode()
    output = command.run(codex.HOST, command.HookOptions(url="http://127.0.0.1:9"), payload, home)
    assert (output.code, output.stdout) == (0, "")  # allowed all the same
    [note] = output.stderr
    assert note.startswith("ratewarden: could not keep call call_0~")
    assert "No space left on device" in note
    assert "lease" in note
    assert "echo ran" not in note  # never the arguments


def test_without_a_ledger_folder_both_hooks_derive_the_id(home: dict[str, str]) -> None:
    # No $HOME nor $XDG_*: as before the ledger, the id is made of session and turn.
    pre = codex.read(json.dumps(call()).encode(), {})
    assert isinstance(pre, PreCall)
    assert pre.call_id == codex.call_id(call())
    codex.opened(pre, {})  # keeps nothing: there is nowhere to
    assert closed(call(), {}) == pre.call_id


@pytest.mark.parametrize("decision", ["deny", "ask"])
def test_the_command_hook_keeps_only_allowed_calls(
    home: dict[str, str], monkeypatch: pytest.MonkeyPatch, decision: str
) -> None:
    answers = iter([{"decision": decision, "message": "no"}, {"decision": "allow"}])
    monkeypatch.setattr(command, "_post", lambda *args: next(answers))
    payload = json.dumps(call()).encode()
    refused = command.run(codex.HOST, command.HookOptions(url="http://127.0.0.1:9"), payload, home)
    assert json.loads(refused.stdout)["hookSpecificOutput"]["permissionDecision"] == "deny"
    assert ledger_files(home) in ([], [".lock"])
    allowed = command.run(codex.HOST, command.HookOptions(url="http://127.0.0.1:9"), payload, home)
    assert allowed == codex.HOST.allow
    assert len(ledger_files(home)) == 2  # the lock, and the session's open call


def test_the_command_hook_keeps_nothing_when_the_daemon_is_away(home: dict[str, str]) -> None:
    # Failing open the call runs, but the daemon never saw it: nothing to settle.
    payload = json.dumps(call()).encode()
    options = command.HookOptions(url="http://127.0.0.1:9", timeout=0.5)
    output = command.run(codex.HOST, options, payload, home)
    assert output.code == 0
    assert ledger_files(home) in ([], [".lock"])
