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

Model calls (issue 31; docs/budgets.md): configured under `BeforeModel` and `AfterModel`,
the hook checks each model call and settles it. BeforeModel's `llm_request` names the
`model`, its `messages` (their text only: the input tokens are estimated from it) and
its `config.maxOutputTokens`; a refusal is `{"decision": "deny", "reason": ...}` with a
synthetic answer (`hookSpecificOutput.llm_response`) holding the same sentence: Gemini
sends nothing to the model, says `Agent execution blocked: <reason>` and shows the
sentence as the model's answer. AfterModel fires for every streamed chunk with
`llm_request` and `llm_response`; only the chunk that ends the answer (a candidate with
a `finishReason`) settles the call, with its `usageMetadata` (`promptTokenCount`,
`candidatesTokenCount`, `totalTokenCount`: Gemini's hook payload carries no cached
tokens, so a cached prompt is charged at the input price; output tokens are the total
less the prompt, thinking tokens included). No event names the call either: the
BeforeModel hook keeps the call id in the hook ledger (hooks/ledger.py) under the
session and the model, and the AfterModel hook of the final chunk takes it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ratewarden import vocabulary
from ratewarden.hooks.contract import (
    BadInput,
    Event,
    HookOutput,
    Host,
    ModelCall,
    ModelDone,
    PreCall,
    event_name,
    json_object,
    string,
    tool_name,
)
from ratewarden.vocabulary import DecisionName

EXIT_WARNING = 1  # a failed hook: Gemini warns and runs the call
EXIT_BLOCK = 2  # block, stderr as the reason
CHARS_PER_TOKEN = 4  # as integrations._model_calls estimates (not imported: a hook stays light)
MAX = vocabulary.MAX_TOKENS  # the wire's cap on a token count


def read(payload: bytes, context: Mapping[str, str]) -> Event:
    data = json_object(payload)
    event = event_name(data)
    if event == "BeforeModel":
        return _model_call(data)
    if event == "AfterModel":
        return _model_done(data)
    if event != "BeforeTool":
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


def _model_call(data: dict[str, Any]) -> ModelCall:
    request = _object(data.get("llm_request"))
    model = request.get("model")
    if not isinstance(model, str) or not model:
        raise BadInput("no model in llm_request")
    texts = [
        message["content"]
        for message in request.get("messages") or ()
        if isinstance(message, dict) and isinstance(message.get("content"), str)
    ]
    limit = _count(_object(request.get("config")).get("maxOutputTokens"))
    return ModelCall(
        model=model,
        session=string(data.get("session_id")),
        input_tokens=min(-(-sum(len(text) for text in texts) // CHARS_PER_TOKEN), MAX),
        max_output_tokens=limit or None,
    )


def _model_done(data: dict[str, Any]) -> ModelDone | None:
    """The final chunk's usage; None for a chunk that does not end the answer."""
    request, response = _object(data.get("llm_request")), _object(data.get("llm_response"))
    candidates = response.get("candidates")
    ended = isinstance(candidates, list) and any(
        isinstance(c, dict) and c.get("finishReason") for c in candidates
    )
    model = request.get("model")
    if not ended or not isinstance(model, str) or not model:
        return None
    found = response.get("usageMetadata")
    if not isinstance(found, dict):
        return ModelDone(model, string(data.get("session_id")))
    prompt, answer = (
        _count(found.get("promptTokenCount")),
        _count(found.get("candidatesTokenCount")),
    )
    output = max(answer, _count(found.get("totalTokenCount")) - prompt)  # with thoughts
    usage = {
        "input_tokens": prompt,
        "output_tokens": output,
        "cache_read_tokens": min(_count(found.get("cachedContentTokenCount")), prompt),
    }
    return ModelDone(model, string(data.get("session_id")), usage)


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _count(value: Any) -> int:
    """A token count from the payload: a positive int (at most the wire's cap: a larger
    one is reserved or charged at the cap, not refused by the daemon), else 0."""
    valid = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return min(value, MAX) if valid else 0


def refuse_model(decision: DecisionName, message: str) -> HookOutput:
    """A refused model call: a deny, and the sentence as the model's (synthetic) answer."""
    reason = message or vocabulary.REFUSED_BY.format(decision=decision)
    if decision == "ask":
        reason = vocabulary.needs_approval(reason)
    answer = {
        "candidates": [{"content": {"role": "model", "parts": [reason]}, "finishReason": "STOP"}]
    }
    output = {"hookEventName": "BeforeModel", "llm_response": answer}
    return HookOutput(
        stdout=json.dumps({"decision": "deny", "reason": reason, "hookSpecificOutput": output})
    )


def refuse_unreadable(message: str) -> HookOutput:
    return HookOutput(code=EXIT_BLOCK, stderr=(message,))


HOST = Host("gemini", read, refuse, refuse_unreadable, EXIT_WARNING, refuse_model=refuse_model)
