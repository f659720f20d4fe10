"""hermes-agent's shell hooks (pre_tool_call / post_tool_call, JSON on stdin and stdout).

Allowed: exit 0 and nothing printed. Refused: exit 0 and `{"action": "block", "message":
...}`; a shell hook can only block, so an `ask` blocks with its message. After the call,
post_tool_call settles it by the id both hooks derive (`call_id`), with the digest of the
tool's `result` (the text the model reads, in `extra`) for loop rules keyed on results.
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

EXIT_HOOK_ERROR = 1  # hermes logs a failed hook and runs the call


def read(payload: bytes, context: Mapping[str, str]) -> Event:
    # hermes' `extra` carries task_id, tool_call_id, turn_id, api_request_id (and, after
    # the call, status and duration_ms) but no user: the gateway keeps its user ids in
    # context variables that a shell hook never sees, so the user comes from --user.
    data = json_object(payload)
    event = event_name(data)
    extra = data.get("extra")
    if not isinstance(extra, dict):
        extra = {}
    if event == "pre_tool_call":
        return PreCall(
            tool=tool_name(data.get("tool_name"), "tool_name"),
            session=string(data.get("session_id")),
            call_id=call_id(extra),
            args=data.get("tool_input"),
        )
    if event == "post_tool_call":
        found = call_id(extra)
        if found is None:
            return None
        status = text(extra.get("status"), 32)
        # "blocked": another hook stopped the call after ratewarden allowed it; it never ran.
        cost = 0.0 if status == CallStatus.BLOCKED else None
        ran = status != CallStatus.BLOCKED
        return PostCall(
            found,
            status=status,
            duration_ms=duration(extra.get("duration_ms")),
            cost=cost,
            result_digest=digest_of(extra, "result") if ran else None,
        )
    return None


def call_id(extra: dict[str, Any]) -> str | None:
    """The model's tool_call_id, made unique with hermes' api_request_id.

    Some model servers send ids such as `call_0` on every turn. hermes' api_request_id
    (`<turn>:api:<n>`) names one model response and is the same in a call's pre and post
    hooks, so the pair identifies the call and both hooks derive the same id:
    `<tool_call_id>~<16 hex digits of both>` (`vocabulary.call_id`).
    """
    call = string(extra.get("tool_call_id"))
    response = extra.get("api_request_id")
    if call is None or not isinstance(response, str) or not response:
        return call
    return vocabulary.call_id("hermes", call, unique=response)


def block(message: str) -> HookOutput:
    return HookOutput(stdout=json.dumps({"action": "block", "message": message}))


def refuse(decision: DecisionName, message: str, detail: str = "") -> HookOutput:
    # A shell hook can only block; hermes has no way to ask a human from one. Its one
    # message goes to the model: no room for the detail.
    return block(message or vocabulary.BLOCKED)


HOST = Host("hermes", read, refuse, block, EXIT_HOOK_ERROR)
