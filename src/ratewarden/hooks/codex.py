"""Codex CLI's command hooks (`@openai/codex`; read from 0.169.0: the input and output
JSON schemas bundled in its binary, and codex-rs/hooks/src/events/pre_tool_use.rs).

Configured in `$CODEX_HOME/config.toml` (`[[hooks.PreToolUse]]`, a `matcher` and
`[[hooks.PreToolUse.hooks]] type = "command"`) or a `hooks.json` beside it; Codex runs
the command with `$SHELL -lc`.

Payload: `hook_event_name`, `session_id`, `turn_id`, `tool_name`, `tool_input`,
`tool_use_id` (the model's call id), `cwd`, `model`, `permission_mode`,
`transcript_path`; PostToolUse adds `tool_response` (no duration, no status). The shell
tools (`exec_command`, `shell`) are all `Bash` to a hook, with `{"command": ...}` as
their input; `apply_patch` is `apply_patch`, an MCP tool its own name.

An allowed call gets nothing (exit 0, nothing printed). A refusal is exit 0 and
`{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
"permissionDecisionReason": ...}}`: Codex skips the call and hands the reason to the
model. Codex has no `ask`: it takes `permissionDecision: "ask"` (and `"allow"`) as
unsupported, counts the hook as failed, and runs the call; so an ask is a deny whose
message says that a human must approve. Exit 2 with stderr blocks too; any other exit
status is a failed hook, and the call runs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ratewarden import vocabulary
from ratewarden.hooks.contract import (
    Decision,
    Event,
    HookOutput,
    Host,
    PostCall,
    PreCall,
    event_name,
    json_object,
    string,
    tool_name,
)

EXIT_HOOK_ERROR = 1  # a failed hook: Codex logs it and runs the call
EXIT_BLOCK = 2  # block, stderr as the reason


def read(payload: bytes, context: Mapping[str, str]) -> Event:
    data = json_object(payload)
    event = event_name(data)
    if event == "PreToolUse":
        return PreCall(
            tool=tool_name(data.get("tool_name"), "tool_name"),
            session=string(data.get("session_id")),
            call_id=call_id(data),
            args=data.get("tool_input"),
        )
    if event == "PostToolUse":
        found = call_id(data)
        return None if found is None else PostCall(found)
    return None


def call_id(data: dict[str, Any]) -> str | None:
    """The model's call id, made unique with Codex's session and turn.

    A model server behind a custom provider may send the same ids (`call_0`) in every
    session. Both hooks of a call carry the same `session_id` and `turn_id`, so both
    derive the same `<tool_use_id>~<16 hex digits>` (`vocabulary.call_id`).
    """
    call = string(data.get("tool_use_id"))
    session, turn = string(data.get("session_id")), string(data.get("turn_id"))
    if call is None or (session is None and turn is None):
        return call
    return vocabulary.call_id("codex", call, unique=f"{session}\x00{turn}")


def refuse(decision: Decision, message: str) -> HookOutput:
    reason = message or vocabulary.REFUSED_BY.format(decision=decision)  # Codex wants one
    if decision == "ask":  # unsupported by Codex, which would run the call
        reason = vocabulary.needs_approval(reason)
    output = {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": reason,
        }
    }
    return HookOutput(stdout=json.dumps(output))


def refuse_unreadable(message: str) -> HookOutput:
    # The event is unknown, so no PreToolUse JSON: exit 2 blocks with stderr as the reason.
    return HookOutput(code=EXIT_BLOCK, stderr=(message,))


HOST = Host("codex", read, refuse, refuse_unreadable, EXIT_HOOK_ERROR)
