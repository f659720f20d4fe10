"""Between the wire (request/response bodies) and the engine's own types."""

from __future__ import annotations

import uuid

from ratewarden.calls import UNCLASSIFIED, Call, ToolFacts
from ratewarden.engine import Decision, Usage, Verdict
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
    return f"rw-{uuid.uuid4().hex}"


def to_response(decision: Decision) -> CheckResponse:
    return CheckResponse(
        decision=decision.decision,
        allowed=decision.allowed,
        message=decision.message,
        call_id=decision.call_id,
        retry_after=decision.retry_after,
        degraded=decision.degraded,
        approved=decision.approved,
        violations=[_violation(v) for v in decision.violations],
        shadow=[_violation(v) for v in decision.shadow],
        warnings=list(decision.warnings),
        limits=[_limit_state(v) for v in decision.limits],
        replayed=decision.replayed,
    )


def _violation(verdict: Verdict) -> Violation:
    return Violation(
        rule=verdict.rule,
        kind=verdict.kind,
        limit=verdict.limit,
        window=verdict.window,
        remaining=verdict.remaining,
        retry_after=verdict.retry_after,
        message=verdict.message,
        spent=verdict.spent,
        reserved=verdict.reserved,
        currency=verdict.currency,
        period=verdict.period,
    )


def _limit_state(verdict: Verdict) -> LimitState:
    return LimitState(
        rule=verdict.rule,
        kind=verdict.kind,
        limit=verdict.limit,
        window=verdict.window,
        remaining=verdict.remaining,
        reset_after=verdict.reset_after,
        spent=verdict.spent,
        reserved=verdict.reserved,
        currency=verdict.currency,
        period=verdict.period,
    )


def to_usage_item(usage: Usage) -> UsageItem:
    return UsageItem(
        rule=usage.rule,
        kind=usage.kind,
        algorithm=usage.algorithm,
        mode=usage.mode,
        limit=usage.limit,
        window=usage.window,
        used=usage.used,
        remaining=usage.remaining,
        reset_after=usage.reset_after,
        scope=usage.scope,
        reserved=usage.reserved,
        currency=usage.currency,
        period=usage.period,
    )
