"""The home of how a host's names and ids become ones the daemon takes: every check an
adapter or hook sends is built by `check_request`.

A host may hand us anything: a tool-call id with a control character, a tool or user
name of 300 characters. A check the API refuses is answered by the fail mode, and failing
open that is an unchecked call, even for a user already over the limit. So nothing the
host says is sent as it is unless the API takes it:

- a name (user, tool, session, team) the API takes is sent unchanged; any other is mapped
  to `<its first characters>~<16 hex digits of its SHA-256>`, at most 256 characters,
  control characters left out of the prefix. The same name always maps to the same
  counter, and two names that differ anywhere (even past the prefix) map apart;
- a call id the daemon can use (taken by the API, and settleable: `.` and `..` vanish
  from a URL path) is sent unchanged; any other is replaced the same way, at most 128
  characters, so a host's pre and post hooks still name one call.

"Takes" is decided by the wire model's own field types (`ratewarden.wire`), so this
module follows any change there; names must also be encodable as UTF-8 (a lone
surrogate from a JSON `\\ud800` cannot be sent at all).

A mapped name or id has the shape of every call id an adapter makes
(`vocabulary.call_id`): `<lead>~<16 hex digits>`.

The call's arguments go in too (`call_args`): as the JSON object the wire takes, or, past
its caps, bounded to fit with the paths that were cut named (`arguments.bounded_args`):
too much argument never makes a call one without arguments, nor costs it its check.
Whether they then travel is the client's business (`client.ArgsGate`: only while the
policy reads them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError, from_json, to_json, to_jsonable_python

from ratewarden.arguments import MAX_CUT, WHOLE_ARGS, BoundedArgs, bounded_args
from ratewarden.vocabulary import (
    MAX_CALL_ID,
    MAX_NAME,
    MAX_TOKENS,
    SUFFIX_CHARS,
    CallKind,
    digest,
    sendable,
    tagged,
)
from ratewarden.wire.bodies import MAX_ARGS_BYTES, Args, CallId, CheckRequest, Subject, ToolMetadata
from ratewarden.wire.bounded import MAX_ITEMS, count_items

__all__ = [
    "DIGEST_CHARS",
    "MAX_ARGS_ITEMS",
    "MAX_CALL_ID",
    "MAX_SUBJECT",
    "bounded_tokens",
    "call_args",
    "check_request",
    "mapped",
    "subject",
    "usable_call_id",
]

MAX_SUBJECT = MAX_NAME  # the API's limit on user, tool, session and team
DIGEST_CHARS = SUFFIX_CHARS  # 64 bits of SHA-256: no two names a host will ever send share one
UNSETTLEABLE = frozenset({".", ".."})  # httpx removes them from the settle URL's path

_SUBJECT: TypeAdapter[str] = TypeAdapter(Subject)
_CALL_ID: TypeAdapter[str] = TypeAdapter(CallId)
_ARGS: TypeAdapter[dict[str, Any]] = TypeAdapter(Args)
# The daemon refuses a body of more than MAX_ITEMS items unread (wire.too_many_items), so
# the args get what the rest of a check leaves: at most 49 items (the body's brackets and
# commas, metadata's, 32 tags' and the comma before `args`), rounded up.
MAX_ARGS_ITEMS = MAX_ITEMS - 64


def subject(name: str) -> str:
    """`name` if the API takes it as a user, tool, session or team; else its mapping."""
    return name if _takes(_SUBJECT, name) else mapped(name, MAX_SUBJECT)


def usable_call_id(value: str) -> str:
    """`value` if the daemon can check and settle a call by it; else its mapping."""
    usable = value not in UNSETTLEABLE and _takes(_CALL_ID, value)
    return value if usable else mapped(value, MAX_CALL_ID)


def mapped(value: str, limit: int) -> str:
    """`<prefix>~<digest>` in at most `limit` characters: the same for the same `value`."""
    return tagged(value, digest(value), limit)


def model_check_request(
    *,
    user: str,
    model: str,
    input_tokens: int | None = None,
    max_output_tokens: int | None = None,
    session: str | None = None,
    team: str | None = None,
    call_id: str | None = None,
) -> CheckRequest:
    """The check for one model call (docs/budgets.md), every name and id made acceptable
    and every count within the wire's bounds (a count past MAX_TOKENS is sent as it)."""
    return CheckRequest(
        user=subject(user),
        kind=CallKind.MODEL,
        tool=subject(model),
        model=subject(model),
        input_tokens=None if input_tokens is None else bounded_tokens(input_tokens),
        max_output_tokens=None if max_output_tokens is None else bounded_tokens(max_output_tokens),
        session=subject(session) if session else None,
        team=subject(team) if team else None,
        call_id=usable_call_id(call_id) if call_id else None,
    )


def bounded_tokens(count: int) -> int:
    """A token count as the wire takes it (0..MAX_TOKENS), for a model call's check and
    its settle (`integrations._lifecycle.usage_settlement`) alike."""
    return min(max(int(count), 0), MAX_TOKENS)


def check_request(
    *,
    user: str,
    tool: str,
    session: str | None = None,
    team: str | None = None,
    call_id: str | None = None,
    metadata: ToolMetadata | None = None,
    approved: bool = False,
    args: object = None,
    args_cut: Sequence[str] = (),
    host: str | None = None,
    host_tool: str | None = None,
) -> CheckRequest:
    """The check for one tool call, every name and id made acceptable (empty: absent);
    `args` as the host gives them (see `call_args`), `args_cut` what a hook already cut.
    `host`: whose names `tool` and `args` are in (the daemon maps them: wire/tools.py);
    `host_tool`: the host's own name, when `tool` already is the canonical one."""
    request = CheckRequest(
        user=subject(user),
        tool=subject(tool),
        host=subject(host) if host else None,
        host_tool=subject(host_tool) if host_tool else None,
        session=subject(session) if session else None,
        team=subject(team) if team else None,
        call_id=usable_call_id(call_id) if call_id else None,
        metadata=metadata,
        approved=approved,
    )
    sent = call_args(args)
    if sent is None:
        return request
    cut = list(dict.fromkeys((*args_cut, *sent.cut)))
    if len(cut) > MAX_CUT:
        cut = [WHOLE_ARGS]
    # Validated once, by the wire's own type (or bounded to fit it): the copy does not
    # validate them again.
    return request.model_copy(update={"args": sent.value, "args_cut": cut or None})


def call_args(value: object) -> BoundedArgs | None:
    """A tool call's arguments as the daemon takes them, or None for a call with none.

    Hosts give a dict (hermes, Strands, pydantic-ai, Claude Code's `tool_input`) or JSON
    text (the OpenAI Agents SDK's `tool_arguments`, agent-code's stdin). Arguments the
    wire takes go whole. Any others (over MAX_ARGS_BYTES as compact JSON, deeper than
    MAX_ARGS_DEPTH, a number not finite, more items than a body may hold, not a JSON
    object at all) go bounded, with the paths that were cut named (`arguments.
    bounded_args`): a call is never checked as if it had no arguments because it had too
    much of them. Nothing here logs them, nor a validation error, which would quote them:
    arguments may hold secrets.
    """
    if value is None:
        return None
    if isinstance(value, str | bytes | bytearray):
        parsed = _from_json(value)
        if parsed is None:
            return bounded_args(value)
        value = parsed
    if not isinstance(value, Mapping):
        return bounded_args(value)
    if _surely_too_large(value):  # no copy of what will be cut anyway
        return bounded_args(value)
    try:
        # JSON's own types, which the client can send: a host's Python objects (a date
        # pydantic-ai validated, a tuple) become what the wire would read them as.
        plain = to_jsonable_python(dict(value), fallback=str)
    except (ValueError, PydanticSerializationError, RecursionError):
        return bounded_args(value)
    whole = _sendable(plain)
    return BoundedArgs(whole) if whole is not None else bounded_args(plain)


def _surely_too_large(args: Mapping[str, Any]) -> bool:
    """Whether `args` hold more characters than the wire takes bytes, or more items: then
    they cannot be sent whole, and validating them (writing megabytes as JSON) is skipped.
    A count of lengths, without reading any text, stopping at the first cap it passes."""
    room, items = MAX_ARGS_BYTES, MAX_ARGS_ITEMS
    stack: list[Any] = [args]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            room -= len(value)
        elif isinstance(value, Mapping):
            items -= len(value)
            room -= sum(len(key) for key in value if isinstance(key, str))
            stack.extend(value.values())
        elif isinstance(value, list):
            items -= len(value)
            stack.extend(value)
        if room < 0 or items < 0:
            return True
    return False


def _from_json(text: str | bytes | bytearray) -> dict[str, Any] | None:
    """The JSON object `text` holds, or None (not JSON, not an object, too deep)."""
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or too deep to parse
        return None
    return parsed if isinstance(parsed, dict) else None


def _sendable(args: dict[str, Any]) -> dict[str, Any] | None:
    """`args` if the daemon would take them in a check, else None."""
    try:
        valid = _ARGS.validate_python(args)
    except ValueError:  # a ValidationError: too large, too deep, a number not finite
        return None
    text = to_json(valid)
    # Short args hold neither too many items (each takes a byte of its own) nor an integer
    # too long for a JSON reader (4300 digits): only long ones are looked at again.
    return valid if len(text) <= MAX_ARGS_ITEMS or _readable(text) else None


def _readable(text: bytes) -> bool:
    """Whether the daemon reads these args: within the items left to them, and every
    number one that its JSON reader takes."""
    if count_items(text) > MAX_ARGS_ITEMS:
        return False
    try:
        from_json(text)
    except ValueError:  # "number out of range"
        return False
    return True


def _takes(adapter: TypeAdapter[str], value: str) -> bool:
    try:
        adapter.validate_python(value, strict=True)
    except ValidationError:
        return False
    return sendable(value)  # bounded by the adapter's max_length
