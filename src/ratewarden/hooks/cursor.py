"""Cursor's agent hooks (`.cursor/hooks.json`, `~/.cursor/hooks.json`; read from the
hook runner of Cursor's own agent runtime as `@cursor/sdk` 1.0.32 ships it, and
cursor.com/docs/hooks).

Every payload carries `hook_event_name`, `conversation_id`, `generation_id`,
`session_id` (the conversation's when the session has none), `workspace_roots`,
`cursor_version` and `user_email` (the signed-in user, or null): the user of the check
when the hook is given no `--user`.

- `preToolUse` (every tool): `tool_name` (`Shell`, `Read`, `Write`, `MCP:<tool>`...),
  `tool_input` (Shell: `{"command", "cwd"}`), `tool_use_id`. The hook to use.
- `postToolUse` / `postToolUseFailure`: the same `tool_use_id`, `duration` (ms); a
  success adds `tool_output` (the tool's result as JSON text, whose digest the settle
  carries, for loop rules keyed on results); a failure adds `failure_type`
  (`permission_denied` when a hook refused the call: it never ran). They settle the call.
- `beforeShellExecution` (`command`, `cwd`) and `beforeMCPExecution` (`tool_name`,
  `tool_input`) also work, checked as `Shell` and the MCP tool's name; they name no call,
  so nothing settles them. Configure one of `preToolUse` or these, not both, or a call
  is counted twice.

An allowed call gets `{}`: no `permission`, so Cursor's own approval settings still apply
(an explicit `allow` could skip them), and not nothing, which Cursor counts as a failed
hook (a hook set `failClosed` would then refuse the call). A refusal is
`{"permission": "deny" | "ask", "user_message": ..., "agent_message": ...}`
(the model reads the message; `ask` is Cursor's own approval prompt). Exit 2 blocks too
(stdout, else stderr, as the message); any other non-zero exit is a failed hook.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ratewarden import vocabulary
from ratewarden.hooks.contract import (
    Event,
    HookOutput,
    Host,
    PostCall,
    PreCall,
    digest_of,
    duration,
    event_name,
    json_object,
    string,
    text,
    tool_name,
)
from ratewarden.vocabulary import CallStatus, DecisionName

EXIT_HOOK_ERROR = 1  # a failed hook: the call runs (unless the hook is `failClosed`)
SHELL = "Shell"  # what preToolUse calls Cursor's shell, and so what beforeShellExecution is
MAX_EMAIL = vocabulary.MAX_NAME


def read(payload: bytes, context: Mapping[str, str]) -> Event:
    data = json_object(payload)
    event = event_name(data)
    if event == "preToolUse":
        tool = tool_name(data.get("tool_name"), "tool_name")
        return _call(data, tool, data.get("tool_input"), call_id(data))
    if event == "beforeShellExecution":
        command = data.get("command")
        # A command that is not text is sent as it is: unreadable args, never none.
        return _call(data, SHELL, {"command": command} if command is not None else None)
    if event == "beforeMCPExecution":
        return _call(data, tool_name(data.get("tool_name"), "tool_name"), data.get("tool_input"))
    if event in ("postToolUse", "postToolUseFailure"):
        return _finished(data, failed=event == "postToolUseFailure")
    return None


def _call(data: dict[str, Any], tool: str, args: object, call: str | None = None) -> PreCall:
    return PreCall(
        tool=tool,
        session=session(data),
        call_id=call,
        args=args,
        user=text(data.get("user_email"), MAX_EMAIL),
    )


def _finished(data: dict[str, Any], failed: bool) -> PostCall | None:
    found = call_id(data)
    if found is None:
        return None
    if not failed:
        return PostCall(
            found,
            status=CallStatus.OK,
            duration_ms=duration(data.get("duration")),
            result_digest=digest_of(data, "tool_output"),
        )
    if data.get("failure_type") == "permission_denied":  # refused by a hook: never ran
        return PostCall(found, status=CallStatus.BLOCKED, cost=0.0)
    return PostCall(found, status=CallStatus.ERROR, duration_ms=duration(data.get("duration")))


def session(data: dict[str, Any]) -> str | None:
    return string(data.get("session_id")) or string(data.get("conversation_id"))


def call_id(data: dict[str, Any]) -> str | None:
    """Cursor's `tool_use_id` (the model's call id), made unique with the session, which
    both hooks of a call carry (`vocabulary.call_id`)."""
    call = string(data.get("tool_use_id"))
    found = session(data)
    if call is None or found is None:
        return call
    return vocabulary.call_id("cursor", call, unique=found)


def refuse(decision: DecisionName, message: str, detail: str = "") -> HookOutput:
    message = message or vocabulary.REFUSED_BY.format(decision=decision)
    return HookOutput(stdout=_permission(decision, message, detail))


def refuse_unreadable(message: str) -> HookOutput:
    # Cursor reads a deny from any permission step (pre-tool and before-* events).
    return HookOutput(stdout=_permission("deny", message))


def _permission(decision: DecisionName, message: str, detail: str = "") -> str:
    # The user's message says which rule counted what (the detail) after the sentence;
    # the agent's is the sentence alone.
    shown = f"{message}\n{detail}" if detail else message
    answer = {"permission": decision, "user_message": shown, "agent_message": message}
    return json.dumps(answer)


# Allowed: `{}` (no `permission`: Cursor's own approval settings still apply), since an
# empty output is a failed hook to Cursor, which refuses the call if the hook is failClosed.
HOST = Host(
    "cursor", read, refuse, refuse_unreadable, EXIT_HOOK_ERROR, allow=HookOutput(stdout="{}")
)
