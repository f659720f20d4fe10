"""Codex CLI's command hooks (`@openai/codex`; read from 0.169.0: the input and output
JSON schemas bundled in its binary, `pre-tool-use.command.input` and
`post-tool-use.command.input` in vendor/<target>/bin/codex, and
codex-rs/hooks/src/events/pre_tool_use.rs).

Configured in `$CODEX_HOME/config.toml` (`[[hooks.PreToolUse]]`, a `matcher` and
`[[hooks.PreToolUse.hooks]] type = "command"`) or a `hooks.json` beside it; Codex runs
the command with `$SHELL -lc`.

Payload: `hook_event_name`, `session_id`, `turn_id`, `tool_name`, `tool_input`,
`tool_use_id` (the model's call id), `cwd`, `model`, `permission_mode`,
`transcript_path` (a subagent's also `agent_id`, `agent_type`); PostToolUse adds
`tool_response` (no duration, no status; its digest goes with the settle, for loop rules
keyed on results) and repeats the rest as PreToolUse had it. The
shell tools (`exec_command`, `shell`) are all `Bash` to a hook, with `{"command": ...}`
as their input; `apply_patch` is `apply_patch`, an MCP tool its own name.

An allowed call gets nothing (exit 0, nothing printed). A refusal is exit 0 and
`{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny",
"permissionDecisionReason": ...}}`: Codex skips the call and hands the reason to the
model. Codex has no `ask`: it takes `permissionDecision: "ask"` (and `"allow"`) as
unsupported, counts the hook as failed, and runs the call; so an ask is a deny whose
message says that a human must approve. Exit 2 with stderr blocks too; any other exit
status is a failed hook, and the call runs.

Which call a PostToolUse closes: nothing in its payload tells two calls apart when the
model server gives every call the same id (`call_0`), since `turn_id` is the same for
every call of a prompt and Codex runs parallel calls at once. So each call about to run
gets a fresh id, which the hook keeps once the daemon allowed the call, and the
PostToolUse takes back by the model's id, the tool and its input, else by the id and the
tool (hooks/ledger.py).
Without a ledger folder (none of $XDG_RUNTIME_DIR, $XDG_CACHE_HOME, $HOME; or not POSIX)
both hooks derive the id from the model's id, session and turn, as before: a reused id
is then checked as a new call, but only its first use is settled.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ratewarden import vocabulary
from ratewarden.hooks import ledger
from ratewarden.hooks.contract import (
    Event,
    HookOutput,
    Host,
    PostCall,
    PreCall,
    digest_of,
    event_name,
    json_object,
    string,
    tool_name,
)
from ratewarden.vocabulary import DecisionName

EXIT_HOOK_ERROR = 1  # a failed hook: Codex logs it and runs the call
EXIT_BLOCK = 2  # block, stderr as the reason
NAME = "codex"


def read(payload: bytes, context: Mapping[str, str]) -> Event:
    data = json_object(payload)
    event = event_name(data)
    if event == "PreToolUse":
        return PreCall(
            tool=tool_name(data.get("tool_name"), "tool_name"),
            session=string(data.get("session_id")),
            call_id=opening_id(data, context),
            args=data.get("tool_input"),
        )
    if event == "PostToolUse":
        found = closing_id(data, context)
        if found is None:
            return None
        return PostCall(found, result_digest=digest_of(data, "tool_response"))
    return None


def opening_id(data: dict[str, Any], context: Mapping[str, str]) -> str | None:
    """A call about to run: a fresh id when a ledger will find it for the PostToolUse."""
    model_id = string(data.get("tool_use_id"))
    if model_id is None or _ledger(data, context) is None:
        return call_id(data)
    return vocabulary.call_id(NAME, model_id)


def opened(call: PreCall, environ: Mapping[str, str]) -> None:
    """Keep the id of a call the daemon allowed, for its PostToolUse; OSError if it cannot."""
    where = ledger.folder(NAME, environ)
    if where is None or call.session is None or call.call_id is None:
        return
    found_by = _found_by(call.call_id, call.tool, call.args)
    ledger.keep(where, call.session, found_by, call.call_id, _now_ms())


def closing_id(data: dict[str, Any], context: Mapping[str, str]) -> str | None:
    """A call that finished: the newest id its PreToolUse kept, else the derived one."""
    derived = call_id(data)
    found = _ledger(data, context)
    if derived is None or found is None:
        return derived
    where, session = found
    found_by = _found_by(derived, string(data.get("tool_name")), data.get("tool_input"))
    try:
        return ledger.take(where, session, found_by, _now_ms()) or derived
    except OSError:  # the call's leases free it
        return derived


def _ledger(data: dict[str, Any], context: Mapping[str, str]) -> tuple[str, str] | None:
    """The ledger's folder and the call's session, when there is a ledger to use."""
    session = string(data.get("session_id"))
    where = None if session is None else ledger.folder(NAME, context)
    return None if where is None or session is None else (where, session)


def _found_by(some_call_id: str, tool: str | None, args: object) -> ledger.Keys:
    """What both hooks of a call read alike: the model's id (as the lead of any id made of
    it: `call_0~...`), the tool and its input; else the id and the tool alone, should
    another PreToolUse hook have rewritten the input (Codex takes an `updatedInput`). Not
    the turn: a PreCall does not carry it, and the ledger is a session's."""
    model_id = some_call_id.rpartition(vocabulary.SEPARATOR)[0]
    return ledger.key(model_id, tool, args), ledger.key(model_id, tool)


def _now_ms() -> int:
    from ratewarden.clock import SystemClock  # standard library only, like this module

    return SystemClock().now_ms()


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


def refuse(decision: DecisionName, message: str, detail: str = "") -> HookOutput:
    reason = message or vocabulary.REFUSED_BY.format(decision=decision)  # Codex wants one
    if decision == "ask":  # unsupported by Codex, which would run the call
        reason = vocabulary.needs_approval(reason)
    output: dict[str, object] = {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": reason,
        }
    }
    if detail:  # shown to the user; the reason stays what the model reads
        output["systemMessage"] = detail
    return HookOutput(stdout=json.dumps(output))


def refuse_unreadable(message: str) -> HookOutput:
    # The event is unknown, so no PreToolUse JSON: exit 2 blocks with stderr as the reason.
    return HookOutput(code=EXIT_BLOCK, stderr=(message,))


HOST = Host(NAME, read, refuse, refuse_unreadable, EXIT_HOOK_ERROR, opened=opened)
