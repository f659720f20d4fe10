"""Gemini CLI's command hooks (`@google/gemini-cli`; read from 0.61.0: its bundled
docs/hooks/reference.md and the bundle's hookEventHandler and scheduler).

Configured under `hooks` in `~/.gemini/settings.json` (or a trusted project's
`.gemini/settings.json`): `"BeforeTool": [{"matcher": "run_shell_command", "hooks":
[{"type": "command", "command": ...}]}]`.

Payload: `hook_event_name`, `session_id`, `tool_name` (`run_shell_command`, `read_file`,
an MCP tool as `mcp_<server>_<tool>`), `tool_input` (the model's arguments), `cwd`,
`transcript_path`, `timestamp`; AfterTool adds `tool_response`. No event names the call
(no tool-call id), so a call is never settled: concurrency slots free after the rule's
`lease_timeout`, reservations are charged at their estimate.

An allowed call gets nothing (exit 0, nothing printed). A refusal is exit 0 and
`{"decision": "deny", "reason": ...}`: Gemini skips the call and the model reads
"Tool execution blocked: <reason>". An ask is a deny whose message says that a human
must approve: Gemini's reference documents no ask (0.61 reads an undocumented
`"decision": "ask"`, but older versions take any other decision as allow and would run
the call). Exit 2 blocks with stderr as the reason; any other status is a warning, and
the call runs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from ratewarden import vocabulary
from ratewarden.hooks.contract import (
    Event,
    HookOutput,
    Host,
    PreCall,
    event_name,
    json_object,
    string,
    tool_name,
)
from ratewarden.vocabulary import DecisionName

EXIT_WARNING = 1  # a failed hook: Gemini warns and runs the call
EXIT_BLOCK = 2  # block, stderr as the reason


def read(payload: bytes, context: Mapping[str, str]) -> Event:
    data = json_object(payload)
    if event_name(data) != "BeforeTool":
        return None  # AfterTool names no call to settle
    return PreCall(
        tool=tool_name(data.get("tool_name"), "tool_name"),
        session=string(data.get("session_id")),
        args=data.get("tool_input"),
    )


def refuse(decision: DecisionName, message: str, detail: str = "") -> HookOutput:
    reason = message or vocabulary.REFUSED_BY.format(decision=decision)
    if decision == "ask":
        reason = vocabulary.needs_approval(reason)
    answer = {"decision": "deny", "reason": reason}
    if detail:  # shown to the user; the reason stays what the model reads
        answer["systemMessage"] = detail
    return HookOutput(stdout=json.dumps(answer))


def refuse_unreadable(message: str) -> HookOutput:
    return HookOutput(code=EXIT_BLOCK, stderr=(message,))


HOST = Host("gemini", read, refuse, refuse_unreadable, EXIT_WARNING)
