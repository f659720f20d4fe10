"""Between the wire (request/response bodies) and the engine's own types.

The engine's dataclasses carry the wire's field names, so pydantic reads them by
attribute: a field added to both sides needs no copying code here.
"""

from __future__ import annotations

import secrets
from typing import Any

from ratewarden.calls import UNCLASSIFIED, Call, ToolFacts
from ratewarden.engine import Decision, Usage
from ratewarden.wire import CheckRequest, CheckResponse, LimitState, UsageItem, Violation


def to_call(request: CheckRequest) -> Call:
    """The engine's view of a request; `args` stay behind and are never stored."""
    meta = request.metadata
    facts = (
        UNCLASSIFIED
        if meta is None
        else ToolFacts(
            read_only=meta.read_only,
            destructive=meta.destructive,
            idempotent=meta.idempotent,
            open_world=meta.open_world,
            requires_confirmation=meta.requires_confirmation,
            tags=frozenset(meta.tags),
        )
    )
    return Call(
        user=request.user,
        tool=request.tool,
        call_id=request.call_id or new_call_id(),
        session=request.session,
        team=request.team,
        cost=request.cost,
        facts=facts,
        approved=request.approved,
        named=request.call_id is not None,
    )


def new_call_id() -> str:
    """128 random bits: unguessable, so only the caller who got it can settle the call.
    (Not uuid4, which spends more on building a UUID than on the randomness.)"""
    return "rw-" + secrets.token_hex(16)


def to_response(decision: Decision) -> CheckResponse:
    return CheckResponse.model_validate(decision, from_attributes=True)


def response_body(decision: Decision) -> dict[str, Any]:
    """What `to_response(decision)` serialises to, built straight from the decision.

    The hot path's answer: validating a `CheckResponse` only to serialise it again cost
    more than the engine's own work for five rules. Field names come from the wire models,
    read by attribute as `to_response` reads them; the engine's types already hold the
    wire's types (tests/test_hotpath.py holds both to the same answers, ints and floats
    told apart).
    """
    body = {}
    for name in _RESPONSE_FIELDS:
        value = getattr(decision, name)
        fields = _ITEM_FIELDS.get(name)
        body[name] = (
            value if fields is None else [{f: getattr(v, f) for f in fields} for v in value]
        )
    return body


_RESPONSE_FIELDS = tuple(CheckResponse.model_fields)
_ITEM_FIELDS = {  # the response's lists of verdicts, and the fields each item shows
    "violations": tuple(Violation.model_fields),
    "shadow": tuple(Violation.model_fields),
    "limits": tuple(LimitState.model_fields),
}


def to_usage_item(usage: Usage) -> UsageItem:
    return UsageItem.model_validate(usage, from_attributes=True)
