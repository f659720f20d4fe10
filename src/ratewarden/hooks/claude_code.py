"""Claude Code's hooks (and claude-agent-sdk sessions that load settings).

Payload (stdin of a command hook, the body of an `http` hook): `hook_event_name`,
`tool_name`, `tool_input`, `tool_use_id`, `session_id`; PostToolUse adds `duration_ms`
and `tool_response`, whose digest its settle carries (for loop rules keyed on results),
without the time Claude Code says some tools took (`TIMINGS`: not part of what they got).
An allowed call gets nothing at all (exit 0, or an empty 200): an explicit "allow" would
skip the user's own permission prompt, a security downgrade. A refusal is
`{"hookSpecificOutput": {"permissionDecision": "deny" | "ask", ...}}`, on stdout or as the
HTTP answer's body; `ask` is the user's own prompt. After the call, PostToolUse and
PostToolUseFailure settle it by its `tool_use_id`.

Over HTTP, Claude Code takes a non-2xx answer or no answer as a non-blocking error: the
call runs. So a payload the daemon cannot read, failing closed, is a JSON deny there,
where a command hook exits 2 (Claude Code's generic block, stderr to the model).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from ratewarden.hooks.contract import (
    Event,
    HookOutput,
    Host,
    HttpAnswer,
    PostCall,
    PreCall,
    digest_of,
    duration,
    event_name,
    json_object,
    string,
    tool_name,
)
from ratewarden.vocabulary import CallStatus, DecisionName

# What Claude Code's tool_response says of a call's time, not of its result: WebFetch's and
# Glob's `durationMs`, WebSearch's `durationSeconds`, Task's `totalDurationMs`. Left out of
# the result's digest, so the same answer taking another time is the same result.
TIMINGS = frozenset({"durationMs", "durationSeconds", "totalDurationMs"})
EXIT_HOOK_ERROR = 1  # a hook that failed, without blocking
EXIT_BLOCK = 2  # block, and show stderr to the model


def read(payload: bytes, context: Mapping[str, str]) -> Event:
    data = json_object(payload)
    event = event_name(data)
    if event == "PreToolUse":
        return PreCall(
            tool=tool_name(data.get("tool_name"), "tool_name"),
            session=string(data.get("session_id")),
            call_id=string(data.get("tool_use_id")),
            args=data.get("tool_input"),
        )
    if event in ("PostToolUse", "PostToolUseFailure"):
        call_id = string(data.get("tool_use_id"))
        if call_id is None:
            return None
        status = CallStatus.OK if event == "PostToolUse" else CallStatus.ERROR
        return PostCall(
            call_id,
            status=status,
            duration_ms=duration(data.get("duration_ms")),
            result_digest=digest_of(_untimed(data), "tool_response"),
        )
    return None


def _untimed(data: Mapping[str, object]) -> Mapping[str, object]:
    """The payload with its tool_response's own timings (TIMINGS) left out."""
    response = data.get("tool_response")
    if not isinstance(response, Mapping) or TIMINGS.isdisjoint(response):
        return data
    kept = {key: value for key, value in response.items() if key not in TIMINGS}
    return {**data, "tool_response": kept}


def refuse(decision: DecisionName, message: str, detail: str = "") -> HookOutput:
    answer = _decision(decision, message)
    if detail:  # shown to the user; the reason stays what the model reads
        answer["systemMessage"] = detail
    return HookOutput(stdout=json.dumps(answer))


def refuse_unreadable(message: str) -> HookOutput:
    # The event is unknown, so no PreToolUse JSON: exit 2 is Claude Code's generic block.
    return HookOutput(code=EXIT_BLOCK, stderr=(message,))


def http(output: HookOutput) -> HttpAnswer:
    if output.code == EXIT_BLOCK:  # HTTP has no generic block: a deny says it
        return HttpAnswer(body=json.dumps(_decision("deny", " ".join(output.stderr))))
    if output.code != 0:  # a hook error, not a veto: Claude Code's own non-blocking error
        return HttpAnswer(400, " ".join(output.stderr), "text/plain")
    return HttpAnswer(body=output.stdout)


def _decision(decision: DecisionName, message: str) -> dict[str, object]:
    return {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": decision,  # deny, or ask: the user's own prompt
            "permissionDecisionReason": message,
        }
    }


HOST = Host("claude-code", read, refuse, refuse_unreadable, EXIT_HOOK_ERROR, http=http)
