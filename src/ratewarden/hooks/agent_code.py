"""agent-code's hooks (avala-ai/agent-code).

A command hook runs with `bash -c`; its stdin holds only the tool's input (pre_tool_use)
or `{"tool", "is_error"}` (post_tool_use), and the event and tool are in
AGENT_CODE_HOOK_EVENT and AGENT_CODE_HOOK_TOOL. An HTTP hook posts the same JSON, so the
daemon's route takes the event and tool from its query instead (`?event=pre_tool_use&
tool=Bash`, both required: a 422 names the one missing). Allowed: exit 0 (a 2xx).
Refused: exit 1 (deny) or 3 (ask, which agent-code cannot put to anyone: its line says a
human must approve), or a 403 over HTTP, the message as the one line agent-code reads
(stderr, or the body): the model sees "Blocked by pre-tool-use hook: <line>". It names
no call, so its calls are never settled (slots free after the rule's `lease_timeout`,
reservations are charged at their estimate).

agent-code vetoes on any unsuccessful hook, so a payload the hook cannot read, failing
open, exits 0.
"""

from __future__ import annotations

from collections.abc import Mapping

from ratewarden import vocabulary
from ratewarden.hooks.contract import (
    BadInput,
    Event,
    HookOutput,
    Host,
    HttpAnswer,
    PreCall,
    one_line,
    tool_name,
)
from ratewarden.vocabulary import DecisionName

EXIT_REFUSED = {"deny": 1, "ask": 3}  # the same codes as `ratewarden check`
EVENT, TOOL = "AGENT_CODE_HOOK_EVENT", "AGENT_CODE_HOOK_TOOL"
# An HTTP hook's query names for them (a command hook forwards its environment's).
CONTEXT = {"event": EVENT, "tool": TOOL}


def read(payload: bytes, context: Mapping[str, str]) -> Event:
    event = context.get(EVENT, "")
    if not event:
        raise BadInput(f"{EVENT} is not set (is agent-code running this hook?)")
    if event != "pre_tool_use":
        return None
    tool = tool_name(context.get(TOOL), TOOL)
    # stdin is the tool's input, whole (AGENT_CODE_HOOK_CONTEXT stops at 16 KiB); input
    # that is not a JSON object is sent as no args, never a reason to fail the call.
    return PreCall(tool=tool, args=payload)


def refuse(decision: DecisionName, message: str, detail: str = "") -> HookOutput:
    # agent-code has no one to ask: an `ask` is a veto, saying a human must approve.
    # It reads the first line only, the model's: no room for the detail.
    line = one_line(message) or vocabulary.REFUSED_BY.format(decision=decision)
    if decision == "ask":
        line = vocabulary.needs_approval(line)
    return HookOutput(code=EXIT_REFUSED[decision], stderr=(line,))


def refuse_unreadable(message: str) -> HookOutput:
    return HookOutput(code=EXIT_REFUSED["deny"], stderr=(message,))


def http(output: HookOutput) -> HttpAnswer:
    if output.code == 0:
        return HttpAnswer(body="")
    return HttpAnswer(403, " ".join(output.stderr), "text/plain")


HOST = Host("agent-code", read, refuse, refuse_unreadable, 0, context=CONTEXT, http=http)
