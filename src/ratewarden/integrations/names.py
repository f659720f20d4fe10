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
"""

from __future__ import annotations

from pydantic import TypeAdapter, ValidationError

from ratewarden.vocabulary import MAX_CALL_ID, MAX_NAME, SUFFIX_CHARS, digest, sendable, tagged
from ratewarden.wire import CallId, CheckRequest, Subject, ToolMetadata

__all__ = [
    "DIGEST_CHARS",
    "MAX_CALL_ID",
    "MAX_SUBJECT",
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


def check_request(
    *,
    user: str,
    tool: str,
    session: str | None = None,
    team: str | None = None,
    call_id: str | None = None,
    metadata: ToolMetadata | None = None,
    approved: bool = False,
) -> CheckRequest:
    """The check for one tool call, every name and id made acceptable (empty: absent)."""
    return CheckRequest(
        user=subject(user),
        tool=subject(tool),
        session=subject(session) if session else None,
        team=subject(team) if team else None,
        call_id=usable_call_id(call_id) if call_id else None,
        metadata=metadata,
        approved=approved,
    )


def _takes(adapter: TypeAdapter[str], value: str) -> bool:
    try:
        adapter.validate_python(value, strict=True)
    except ValidationError:
        return False
    return sendable(value)  # bounded by the adapter's max_length
