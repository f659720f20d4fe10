"""`ratewarden hook HOST`: the command hooks of hosts that run a program around each tool call.

Each host hands the hook a payload (stdin, and for agent-code environment variables) and
reads the answer its own way. What each host gets back:

- claude-code: allowed, exit 0 and nothing printed; denied or needs approval, exit 0 and
  `{"hookSpecificOutput": {"permissionDecision": "deny" | "ask", ...}}` on stdout.
- agent-code: allowed, exit 0; refused, exit 1 (deny) or 3 (ask) with the message as the
  one line on stderr (agent-code shows the model "Blocked by pre-tool-use hook: <line>").
- hermes: allowed, exit 0 and nothing printed; refused, exit 0 and
  `{"action": "block", "message": ...}` on stdout.

An allowed call prints nothing at all: Claude Code reads an explicit "allow" as "skip the
user's own permission prompt", which would be a security downgrade. After the tool ran, the
hosts that name the call (Claude Code's `tool_use_id`, hermes' `tool_call_id`) get it
settled: concurrency slots are released and budgets charged. agent-code names no call, so
its calls are never settled (slots free after the rule's `lease_timeout`, reservations are
charged at their estimate).

When the daemon cannot answer (down, too slow, or refusing the request), `--fail open` (the
default) allows the call and says so on stderr; `--fail closed` blocks it with "Tool guard
unavailable; Bash calls are paused". A call id the host reuses is never a free pass: the
call is checked again as a new one (see `_ask`).

A name or id the daemon would refuse (a tool-call id with a control character, a tool or
user name of 300 characters) is no reason to fail: it is mapped to one the daemon takes
(`ratewarden.integrations.names`) and the call is checked like any other. The tool's
input (Claude Code's and hermes' `tool_input`, agent-code's stdin) goes with the check as
its `args` when the daemon's policy reads them; input the daemon would not take (not a
JSON object, over the wire's caps) is left out and the call checked without it.

Input the hook cannot read (not JSON, no tool name) is a broken installation, not a
decision. Failing open, it is reported as the host's non-blocking hook error (Claude Code
and hermes: exit 1, the reason on stderr; agent-code vetoes on any non-zero exit, so there
it is exit 0). Failing closed, the call is blocked (Claude Code: exit 2, its generic block,
which hands stderr to the model).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from ratewarden import vocabulary
from ratewarden.client import Client, ClientError, DaemonUnavailable
from ratewarden.client import unreachable_answer as fail_mode_answer
from ratewarden.integrations._identity import default_user
from ratewarden.integrations.names import check_request, usable_call_id
from ratewarden.vocabulary import ADAPTER_TIMEOUT_S, ClientSettings
from ratewarden.wire import CheckRequest, CheckResponse, SettleRequest

EXIT_REFUSED = {"deny": 1, "ask": 3}  # agent-code; the same codes as `ratewarden check`
EXIT_HOOK_ERROR = 1  # Claude Code and hermes: a hook that failed, without blocking
EXIT_CLAUDE_BLOCK = 2  # Claude Code: block, and show stderr to the model


@dataclass(frozen=True)
class HookOptions:
    """The command's flags; `None` falls back to RATEWARDEN_USER / _URL / _TOKEN."""

    user: str | None = None
    team: str | None = None
    url: str | None = None
    token: str | None = None
    fail: str = "open"
    timeout: float = ADAPTER_TIMEOUT_S


@dataclass(frozen=True)
class HookOutput:
    """What the hook process says: its exit status, stdout, and stderr lines."""

    code: int = 0
    stdout: str = ""
    stderr: tuple[str, ...] = ()


class BadInput(Exception):
    """The host's payload cannot be read: a broken installation, not a decision."""


@dataclass(frozen=True)
class PreCall:
    """A tool call about to run; `args` as the host wrote them (names.call_args reads them)."""

    tool: str
    session: str | None = None
    call_id: str | None = None
    args: object = field(default=None, repr=False)  # never shown: they may hold secrets


@dataclass(frozen=True)
class PostCall:
    """A tool call that finished (or was stopped after ratewarden allowed it)."""

    call_id: str
    status: str | None = None
    duration_ms: float | None = None
    cost: float | None = None


Event = PreCall | PostCall | None  # None: an event this hook has nothing to do for


@dataclass(frozen=True)
class Host:
    """How one host speaks: read its payload, word a refusal, report unreadable input."""

    name: str
    read: Callable[[bytes, Mapping[str, str]], Event]
    refuse: Callable[[CheckResponse], HookOutput]
    refuse_unreadable: Callable[[str], HookOutput]
    unreadable_open_code: int


# -- running a hook --------------------------------------------------------------------


def main(host_name: str, options: HookOptions) -> int:
    """The `ratewarden hook HOST` command: stdin in, the host's answer out."""
    # The fail-mode answer logs the outage; here stderr is part of the answer (agent-code
    # takes its first line as the reason), so the hook writes its own notes instead.
    logging.getLogger("ratewarden").addHandler(logging.NullHandler())
    payload = sys.stdin.buffer.read() if sys.stdin is not None else b""
    output = run(HOSTS[host_name], options, payload, os.environ)
    if output.stdout:
        sys.stdout.write(output.stdout + "\n")
        sys.stdout.flush()
    for line in output.stderr:
        print(line, file=sys.stderr)
    return output.code


def run(host: Host, options: HookOptions, payload: bytes, environ: Mapping[str, str]) -> HookOutput:
    """Read the host's payload, ask the daemon (or settle with it), and answer the host."""
    try:
        event = host.read(payload, environ)
        request = _check_request(options, event, environ) if isinstance(event, PreCall) else None
    except BadInput as exc:
        return _unreadable(host, options, str(exc))
    if event is None:
        return HookOutput()
    settings = ClientSettings.read(environ)
    url = options.url or settings.url
    token = options.token or settings.token
    # The raising client, not the Guard: a hook tells an outage, a refused request and a
    # reused call id apart (each gets its own note or treatment).
    with Client(url, token, timeout=options.timeout) as client:
        if request is not None:
            return _check(host, client, request, options.fail, url)
        assert isinstance(event, PostCall)
        return _settle(client, event)


def _check_request(options: HookOptions, call: PreCall, environ: Mapping[str, str]) -> CheckRequest:
    """The check, its names and ids made acceptable to the daemon (names.py): a host's odd
    id or a long name is still checked, never answered by the fail mode."""
    user = options.user or ClientSettings.read(environ).user or _login_name()
    try:
        return check_request(
            user=user,
            tool=call.tool,
            session=call.session,
            team=options.team,
            call_id=call.call_id,
            args=call.args,
        )
    except ValidationError as exc:  # only if the wire model changes under names.py
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise BadInput(f"cannot build the check ({problems})") from None


def _login_name() -> str:
    try:
        return default_user()
    except (OSError, KeyError):  # no login name: a container user without a passwd entry
        return f"uid-{os.getuid()}"


def _check(host: Host, client: Client, request: CheckRequest, fail: str, url: str) -> HookOutput:
    notes: list[str] = []
    try:
        answer = _ask(client, request, notes)
    except DaemonUnavailable as exc:
        answer = fail_mode_answer(request, fail, exc)
        notes.append(f"ratewarden: daemon unreachable at {url} ({exc}); failing {fail}")
    except ClientError as exc:  # a bad token, a request the daemon will not take...
        answer = fail_mode_answer(request, fail, exc)
        refused = f"the daemon refused the check ({exc.status}: {exc})"
        notes.append(f"ratewarden: {refused}; failing {fail}")
    if answer.decision == "allow":
        return HookOutput(stderr=tuple(_one_line(note) for note in notes))
    refusal = host.refuse(answer)
    return replace(refusal, stderr=(*refusal.stderr, *(_one_line(note) for note in notes)))


def _ask(client: Client, request: CheckRequest, notes: list[str]) -> CheckResponse:
    """The daemon's answer, never a replay: a host that reuses a call id gets no free pass.

    The daemon answers a call_id it already allowed from its record, consuming nothing, and
    refuses one used by another user or tool (409). Either way the host sent an id that is
    not this call's own, so the call is checked again under an id the daemon picks: it is
    counted, but its settle reaches the id's first call instead (this one's slot and
    reservation then expire by themselves).
    """
    try:
        answer = client.check(request)
        if not answer.replayed:
            return answer
    except ClientError as exc:
        if exc.status != 409:
            raise
    notes.append(f"ratewarden: call id {request.call_id} was already used; checked as a new call")
    return client.check(request.model_copy(update={"call_id": None}))


def _settle(client: Client, call: PostCall) -> HookOutput:
    request = SettleRequest(cost=call.cost, status=call.status, duration_ms=call.duration_ms)
    try:
        client.settle(call.call_id, request)
    except (DaemonUnavailable, ClientError) as exc:  # the daemon is away, or an unknown call
        return HookOutput(
            stderr=(_one_line(f"ratewarden: could not settle {call.call_id}: {exc}"),)
        )
    return HookOutput()


def _unreadable(host: Host, options: HookOptions, reason: str) -> HookOutput:
    reason = _one_line(reason)  # agent-code shows only the first line
    if options.fail == "open":
        note = f"ratewarden: {reason}; failing open"
        return HookOutput(code=host.unreadable_open_code, stderr=(note,))
    return host.refuse_unreadable(vocabulary.UNREADABLE.format(host=host.name, reason=reason))


# -- reading payloads --------------------------------------------------------------------


def _json_object(payload: bytes) -> dict[str, Any]:
    try:
        data = json.loads(payload)
    except ValueError as exc:
        raise BadInput(f"stdin is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadInput(f"stdin is JSON but not an object: {type(data).__name__}")
    return data


def _text(value: Any, max_length: int) -> str | None:
    """An optional id from the payload; dropped when it would not be a valid field."""
    if isinstance(value, str) and 0 < len(value) <= max_length:
        return value
    return None


def _string(value: Any) -> str | None:
    """An optional name or id from the payload, as the host sent it (names.py maps it)."""
    return value if isinstance(value, str) and value else None


def _settle_id(value: Any) -> str | None:
    """A call id as its check sent it, so that the post hook settles the same call."""
    found = _string(value)
    return None if found is None else usable_call_id(found)


def _tool(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise BadInput(f"no tool name in {where}")
    return value


def _duration(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _one_line(message: str) -> str:
    return " ".join(message.split())


def _event_name(data: dict[str, Any]) -> str:
    event = data.get("hook_event_name")
    if not isinstance(event, str) or not event:
        raise BadInput("no hook_event_name in the payload")
    return event


# -- Claude Code (and claude-agent-sdk sessions that load settings) ---------------------


def _read_claude(payload: bytes, environ: Mapping[str, str]) -> Event:
    data = _json_object(payload)
    event = _event_name(data)
    if event == "PreToolUse":
        return PreCall(
            tool=_tool(data.get("tool_name"), "tool_name"),
            session=_string(data.get("session_id")),
            call_id=_string(data.get("tool_use_id")),
            args=data.get("tool_input"),
        )
    if event in ("PostToolUse", "PostToolUseFailure"):
        call_id = _settle_id(data.get("tool_use_id"))
        if call_id is None:
            return None
        status = "ok" if event == "PostToolUse" else "error"
        return PostCall(call_id, status=status, duration_ms=_duration(data.get("duration_ms")))
    return None


def _refuse_claude(answer: CheckResponse) -> HookOutput:
    output = {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": answer.decision,  # deny, or ask: the user's own prompt
            "permissionDecisionReason": answer.message,
        }
    }
    return HookOutput(stdout=json.dumps(output))


def _claude_unreadable(message: str) -> HookOutput:
    # The event is unknown, so no PreToolUse JSON: exit 2 is Claude Code's generic block.
    return HookOutput(code=EXIT_CLAUDE_BLOCK, stderr=(message,))


# -- agent-code ---------------------------------------------------------------------------


def _read_agent_code(payload: bytes, environ: Mapping[str, str]) -> Event:
    # stdin holds only the tool's input (pre_tool_use) or {"tool", "is_error"}
    # (post_tool_use): no session, no call id, so there is nothing to settle afterwards.
    event = environ.get("AGENT_CODE_HOOK_EVENT", "")
    if not event:
        raise BadInput("AGENT_CODE_HOOK_EVENT is not set (is agent-code running this hook?)")
    if event != "pre_tool_use":
        return None
    tool = _tool(environ.get("AGENT_CODE_HOOK_TOOL"), "AGENT_CODE_HOOK_TOOL")
    # stdin is the tool's input, whole (AGENT_CODE_HOOK_CONTEXT stops at 16 KiB); input
    # that is not a JSON object is sent as no args, never a reason to fail the call.
    return PreCall(tool=tool, args=payload)


def _refuse_agent_code(answer: CheckResponse) -> HookOutput:
    message = _one_line(answer.message) or vocabulary.REFUSED_BY.format(decision=answer.decision)
    return HookOutput(code=EXIT_REFUSED[answer.decision], stderr=(message,))


def _agent_code_unreadable(message: str) -> HookOutput:
    return HookOutput(code=EXIT_REFUSED["deny"], stderr=(message,))


# -- hermes-agent shell hooks ------------------------------------------------------------


def _read_hermes(payload: bytes, environ: Mapping[str, str]) -> Event:
    # hermes' `extra` carries task_id, tool_call_id, turn_id, api_request_id (and, after
    # the call, status and duration_ms) but no user: the gateway keeps its user ids in
    # context variables that a shell hook never sees, so the user comes from --user.
    data = _json_object(payload)
    event = _event_name(data)
    extra = data.get("extra")
    if not isinstance(extra, dict):
        extra = {}
    if event == "pre_tool_call":
        return PreCall(
            tool=_tool(data.get("tool_name"), "tool_name"),
            session=_string(data.get("session_id")),
            call_id=_hermes_call_id(extra),
            args=data.get("tool_input"),
        )
    if event == "post_tool_call":
        call_id = _settle_id(_hermes_call_id(extra))
        if call_id is None:
            return None
        status = _text(extra.get("status"), 32)
        # "blocked": another hook stopped the call after ratewarden allowed it; it never ran.
        cost = 0.0 if status == "blocked" else None
        duration = _duration(extra.get("duration_ms"))
        return PostCall(call_id, status=status, duration_ms=duration, cost=cost)
    return None


def _hermes_call_id(extra: dict[str, Any]) -> str | None:
    """The model's tool_call_id, made unique with hermes' api_request_id.

    Some model servers send ids such as `call_0` on every turn. hermes' api_request_id
    (`<turn>:api:<n>`) names one model response and is the same in a call's pre and post
    hooks, so the pair identifies the call and both hooks derive the same id:
    `<tool_call_id>~<16 hex digits of both>` (`vocabulary.call_id`).
    """
    call = _string(extra.get("tool_call_id"))
    response = extra.get("api_request_id")
    if call is None or not isinstance(response, str) or not response:
        return call
    return vocabulary.call_id("hermes", call, unique=response)


def _hermes_block(message: str) -> HookOutput:
    return HookOutput(stdout=json.dumps({"action": "block", "message": message}))


def _refuse_hermes(answer: CheckResponse) -> HookOutput:
    # A shell hook can only block; hermes has no way to ask a human from one.
    return _hermes_block(answer.message or vocabulary.BLOCKED)


HOSTS: dict[str, Host] = {
    "claude-code": Host(
        "claude-code", _read_claude, _refuse_claude, _claude_unreadable, EXIT_HOOK_ERROR
    ),
    "agent-code": Host(
        "agent-code", _read_agent_code, _refuse_agent_code, _agent_code_unreadable, 0
    ),
    "hermes": Host("hermes", _read_hermes, _refuse_hermes, _hermes_block, EXIT_HOOK_ERROR),
}

__all__ = ["HOSTS", "BadInput", "HookOptions", "HookOutput", "main", "run"]
