"""What the engine answers, and how each rule's outcome is worded for the model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ratewarden import vocabulary
from ratewarden.calls import Call
from ratewarden.limiter.ops import OpResult
from ratewarden.policy.durations import MICROS, format_amount, humanize_seconds
from ratewarden.policy.messages import Template, default_template, retry_text
from ratewarden.policy.model import (
    Applied,
    BudgetLimit,
    ConcurrencyLimit,
    Policy,
    RateLimit,
    Rule,
)
from ratewarden.vocabulary import CallKind, DecisionName, SettleOutcome
from ratewarden.wire.bodies import ModelUsage

Number = int | float


@dataclass(slots=True)  # built per call: not frozen, whose __init__ costs 5x; never mutated
class Verdict:
    """One rule's view of a call: its limit, what is left, and the sentence for the model."""

    rule: str
    kind: str  # a RuleKind, or UNAVAILABLE (the store down, a fail mode refused)
    admitted: bool  # this rule alone would let the call through
    limit: Number  # calls, slots, or money
    remaining: Number
    retry_after: float | None
    reset_after: float
    message: str = ""
    on_exceed: str = "deny"
    window: str | None = None  # rate rules
    tokens: bool = False  # a token rate: its settle adds the call's tokens
    spent: float | None = None  # budget rules: settled (and expired) spend
    reserved: float | None = None  # budget rules: held by calls not yet settled
    currency: str | None = None
    period: str | None = None
    soft_limited: bool = False  # a budget past its soft limit after this call
    # A refusal's detail (None on an admitting verdict: only refusals pay for it). What
    # was counted, each `per` dimension with the call's value (an `args` one as the
    # counter's digest); what was used (calls in the window, slots, money spent); and,
    # for an access rule or one on `args`, what its `match` asks (the policy's words).
    scope: dict[str, str | None] | None = None
    used: Number | None = None
    condition: str | None = None


@dataclass(slots=True)  # built per call: not frozen, whose __init__ costs 5x; never mutated
class Decision:
    decision: DecisionName
    call_id: str
    message: str = ""
    retry_after: float | None = None
    violations: tuple[Verdict, ...] = ()  # enforcing rules that refused the call
    shadow: tuple[Verdict, ...] = ()  # shadow rules that would have refused it
    approvals: tuple[Verdict, ...] = ()  # `ask` rules an approved call was let past
    limits: tuple[Verdict, ...] = ()  # every rule that applied, after this call
    warnings: tuple[str, ...] = ()
    degraded: bool = False
    approved: bool = False
    replayed: bool = False  # a repeated check, answered from the call's record
    send_args: bool = False  # the policy in force reads `args`: clients send them
    send_result: bool = False  # a loop rule keyed on results counts it: settle with one

    @property
    def allowed(self) -> bool:
        return self.decision == "allow"


@dataclass(frozen=True, slots=True)
class Usage:
    """A rule's counter for one user, read without consuming (GET /v1/usage)."""

    rule: str
    kind: str
    algorithm: str
    mode: str
    limit: Number | None  # None: unlimited for this user
    used: Number  # calls in the window, slots in use, or money spent
    remaining: Number | None
    reset_after: float
    scope: dict[str, str | None] = field(default_factory=dict)
    window: str | None = None
    reserved: float | None = None
    currency: str | None = None
    period: str | None = None


@dataclass(frozen=True, slots=True)
class Settlement:
    call_id: str
    outcome: SettleOutcome
    charged: dict[str, float] = field(default_factory=dict)  # budget rule -> amount charged
    model: str | None = None  # a model call's model
    tokens: int | None = None  # a model call's usage, in tokens (in + out)
    usage: ModelUsage | None = None  # a model call's usage as settled (the metrics')


@dataclass(frozen=True, slots=True)
class Shape:
    """What every verdict of one applied rule shares, worked out once (the engine's plan)."""

    rule: str
    kind: str
    amount: Number  # the limit in the rule's own unit: calls, slots, or money
    on_exceed: str
    window: str | None = None  # rate rules
    budget: BudgetLimit | None = None
    tokens: bool = False  # a token rate

    @classmethod
    def of(cls, applied: Applied) -> Shape:
        rule, limit = applied.rule, applied.limit
        on_exceed = rule.on_exceed.value
        if isinstance(limit, BudgetLimit):
            return cls(rule.name, rule.kind, limit.budget.amount, on_exceed, budget=limit)
        if isinstance(limit, ConcurrencyLimit):
            return cls(rule.name, rule.kind, limit.slots, on_exceed)
        assert isinstance(limit, RateLimit)
        rate = limit.rate
        return cls(rule.name, rule.kind, limit.limit, on_exceed, rate.window, tokens=rate.tokens)


def verdict(
    policy: Policy, applied: Applied, shape: Shape, call: Call, result: OpResult
) -> Verdict:
    """Word one rule's outcome; the message is only built for a refusal."""
    admitted = result.admitted
    retry_after = 0.0 if admitted else _seconds(result.retry_after_ms)
    budget = shape.budget
    if budget is None:
        found = Verdict(
            shape.rule,
            shape.kind,
            admitted,
            shape.amount,
            result.remaining,
            retry_after,
            result.reset_after_ms / 1000,
            on_exceed=shape.on_exceed,
            window=shape.window,
            tokens=shape.tokens,
        )
    else:
        held = result.used + result.reserved
        soft = budget.soft_limit is not None and held >= budget.soft_limit * budget.limit > 0
        found = Verdict(
            shape.rule,
            shape.kind,
            admitted,
            shape.amount,
            result.remaining / MICROS,
            retry_after,
            result.reset_after_ms / 1000,
            on_exceed=shape.on_exceed,
            spent=result.used / MICROS,
            reserved=result.reserved / MICROS,
            currency=budget.currency,
            period=budget.budget.period,
            soft_limited=soft and admitted,
        )
    if admitted:
        return found
    used = result.used if budget is None else found.spent
    return _with_message(found, policy, applied, call, used)


def scope_of(rule: Rule, call: Call) -> dict[str, str | None]:
    """The counter's scope: each of the rule's `per` dimensions with the call's value."""
    return {dim: call.dimension(dim) for dim in rule.per}


def _with_message(
    found: Verdict, policy: Policy, applied: Applied, call: Call, used: Number | None
) -> Verdict:
    rule = applied.rule
    fields: dict[str, object] = {
        "limit": found.limit,
        "label": rule.label or policy.label_for(call.tool),
        "retry_after": retry_text(found.retry_after),
        "remaining": found.remaining,
        "user": call.user,
        "tool": call.tool,
        "rule": rule.name,
        "window": found.window,
    }
    if isinstance(applied.limit, BudgetLimit):
        micros = applied.limit.limit
        fields |= {
            "limit": format_amount(micros),
            "budget": format_amount(micros),
            "spent": f"{found.spent:.2f}",
            "reserved": f"{found.reserved:.2f}",
            "remaining": f"{found.remaining:.2f}",
            "currency": found.currency,
            "period": found.period,
        }
    template = rule.template
    if call.kind == CallKind.MODEL and isinstance(applied.limit, BudgetLimit):
        template = _model_budget(template, fields, found, policy, call)
    elif found.reserved and not template.custom:
        template = _BUDGET_HELD  # the default budget sentence, saying what is held
    return replace(
        found,
        message=template.render(fields, found.retry_after),
        scope=scope_of(rule, call),
        used=used,
        condition=rule.condition,
    )


_BUDGET_HELD = default_template(vocabulary.BUDGET_HELD)
_MODEL_BUDGET = default_template(vocabulary.MODEL_BUDGET)
_MODEL_BUDGET_HELD = default_template(vocabulary.MODEL_BUDGET_HELD)
_TOO_COSTLY = default_template(vocabulary.MODEL_CALL_TOO_COSTLY)


def _model_budget(
    template: Template, fields: dict[str, object], found: Verdict, policy: Policy, call: Call
) -> Template:
    """A budget's default sentence for a model call: what could fit when some of the
    budget is left (a smaller call may), else that it is spent (fields filled in here)."""
    if template.custom:
        return template
    left = round(float(found.remaining) * MICROS)
    most = policy.most_cost(call) or 0
    if 0 < left < most:
        fields["cost"] = f"{-(-most // 10_000) / 100:.2f}"  # in cents, rounded up
        fields["whose"] = vocabulary.PERIOD_OWNER.get(str(found.period), "this period's")
        return _TOO_COSTLY
    return _MODEL_BUDGET_HELD if found.reserved else _MODEL_BUDGET


def soft_limit_warning(found: Verdict, label: str) -> str:
    assert found.spent is not None
    assert found.reserved is not None
    share = 100 * (found.spent + found.reserved) / float(found.limit)
    return vocabulary.SOFT_LIMIT_WARNING.format(
        label=label,
        share=share,
        limit=found.limit,
        currency=found.currency,
        period=found.period,
        rule=found.rule,
    )


def binding(verdicts: Sequence[Verdict]) -> Verdict:
    """The refusal that holds longest (never, for a limit of 0); the first one on a tie."""
    return max(verdicts, key=lambda v: float("inf") if v.retry_after is None else v.retry_after)


def _seconds(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000


def detail_line(verdict: Verdict) -> str:
    """A refusal's detail in one line (vocabulary.REFUSAL_DETAIL), for a host's user: the
    sentence stays the model's; this says which rule counted what. Built only for a
    refusal a hook answers, from what the verdict already holds."""
    counted = (verdict.scope or {}).items()
    # A name is the caller's own text: shown with its invisible characters escaped, so a
    # right-to-left override cannot make the user's line read otherwise.
    scope = ", ".join(
        f"{name}={vocabulary.shown(value) if value is not None else '-'}" for name, value in counted
    )
    used = ""
    if verdict.used is not None:
        used = vocabulary.DETAIL_USED.format(used=verdict.used, limit=verdict.limit)
    retry = ""
    if verdict.retry_after:
        retry = vocabulary.DETAIL_RETRY.format(wait=humanize_seconds(verdict.retry_after))
    return vocabulary.REFUSAL_DETAIL.format(
        rule=verdict.rule,
        kind=verdict.kind,
        scope=vocabulary.DETAIL_SCOPE.format(scope=scope) if scope else "",
        used=used,
        condition=(
            vocabulary.DETAIL_CONDITION.format(condition=verdict.condition)
            if verdict.condition
            else ""
        ),
        retry=retry,
    )
