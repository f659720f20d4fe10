"""The decision: a call, the policy and a store in; allow, deny or ask out.

The engine turns the rules that apply to a call into counter ops, hands all of them to
the store in one atomic step, and words the outcome. It never talks to Redis itself.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from ratewarden.calls import Call
from ratewarden.limiter.ops import CounterOp, OpResult, Role
from ratewarden.policy.messages import default_template, retry_text
from ratewarden.policy.model import Applied, Mode, OnExceed, Policy, RateLimit, Rule
from ratewarden.store.base import Store, StoreError
from ratewarden.store.keys import counter_key

log = logging.getLogger("ratewarden.engine")

DecisionName = Literal["allow", "deny", "ask"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """One rule's view of a call: its limit, what is left, and the sentence for the model."""

    rule: str
    kind: str
    limit: int
    window: str | None
    remaining: int
    retry_after: float | None
    reset_after: float
    message: str
    on_exceed: str


@dataclass(frozen=True, slots=True)
class Decision:
    decision: DecisionName
    call_id: str
    message: str = ""
    retry_after: float | None = None
    violations: tuple[Verdict, ...] = ()  # enforcing rules that refused the call
    shadow: tuple[Verdict, ...] = ()  # shadow rules that would have refused it
    limits: tuple[Verdict, ...] = ()  # every rule that applied, after this call
    warnings: tuple[str, ...] = ()
    degraded: bool = False
    approved: bool = False

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
    limit: int | None  # None: unlimited for this user
    window: str | None
    used: int
    remaining: int | None
    reset_after: float
    scope: dict[str, str | None] = field(default_factory=dict)


class Engine:
    def __init__(self, policy: Policy, store: Store, fail: str | None = None) -> None:
        self.policy = policy
        self.store = store
        self.fail = fail  # the FAIL setting; a rule's own `fail:` still wins

    async def check(self, call: Call) -> Decision:
        """Decide `call` against every rule that applies, consuming all or nothing."""
        policy = self.policy  # one policy for the whole decision, even across a reload
        applied = [a for a in policy.applicable(call) if isinstance(a.limit, RateLimit)]
        if not applied:
            return Decision("allow", call.call_id, approved=call.approved)
        ops = [self._op(a, call) for a in applied]
        try:
            results = await self.store.evaluate(ops)
        except StoreError as exc:
            return self._unavailable(policy, applied, call, exc)
        return self._decide(policy, call, applied, ops, results)

    async def usage(
        self,
        user: str,
        tool: str | None = None,
        session: str | None = None,
        team: str | None = None,
    ) -> list[Usage]:
        """Every counter of `user` that the given parts identify, read without consuming."""
        policy = self.policy
        applied = policy.for_usage(user, tool, session, team)
        probe = Call(user=user, tool=tool or "", call_id="usage", session=session, team=team)
        limited = [a for a in applied if isinstance(a.limit, RateLimit)]
        results = await self.store.evaluate([self._op(a, probe) for a in limited], dry_run=True)
        by_rule = dict(zip((a.rule.name for a in limited), results, strict=True))
        return [self._usage(a, probe, by_rule.get(a.rule.name)) for a in applied]

    @staticmethod
    def _op(applied: Applied, call: Call) -> CounterOp:
        rule, limit = applied.rule, applied.limit
        assert isinstance(limit, RateLimit)
        if rule.mode is Mode.SHADOW:
            role = Role.SHADOW
        elif rule.on_exceed is OnExceed.ASK and call.approved:
            role = Role.FORCED
        else:
            role = Role.ENFORCE
        key = counter_key(rule.name, limit.algorithm, ((d, call.dimension(d)) for d in rule.per))
        burst = limit.burst or limit.limit
        return CounterOp(key, limit.algorithm, limit.limit, limit.rate.window_ms, burst, role)

    def _decide(
        self,
        policy: Policy,
        call: Call,
        applied: Sequence[Applied],
        ops: Sequence[CounterOp],
        results: Sequence[OpResult],
    ) -> Decision:
        violations: list[Verdict] = []
        shadow: list[Verdict] = []
        warnings: list[str] = []
        limits = []
        for a, op, result in zip(applied, ops, results, strict=True):
            verdict = _verdict(policy, a, call, result)
            limits.append(verdict)
            if result.admitted:
                continue
            if op.role is Role.SHADOW:
                shadow.append(verdict)
            elif op.role is Role.FORCED:
                warnings.append(f"approved past {a.rule.name}: {verdict.message}")
            else:
                violations.append(verdict)
        common = {"shadow": tuple(shadow), "limits": tuple(limits), "warnings": tuple(warnings)}
        if not violations:
            return Decision("allow", call.call_id, approved=call.approved, **common)  # type: ignore[arg-type]
        denials = [v for v in violations if v.on_exceed == OnExceed.DENY]
        binding = _binding(denials or violations)
        return Decision(
            "deny" if denials else "ask",
            call.call_id,
            message=binding.message,
            retry_after=binding.retry_after,
            violations=tuple(violations),
            **common,  # type: ignore[arg-type]
        )

    def _unavailable(
        self, policy: Policy, applied: Sequence[Applied], call: Call, error: StoreError
    ) -> Decision:
        """The store did not answer: each enforcing rule's `fail` mode decides."""
        log.warning("store unavailable, deciding by fail mode: %s", error)
        default = self.fail or policy.defaults["fail"]
        closed = [
            a.rule
            for a in applied
            if (a.rule.fail or default) == "closed" and a.rule.mode is Mode.ENFORCE
        ]
        if not closed:
            return Decision("allow", call.call_id, degraded=True, approved=call.approved)
        rule = closed[0]
        label = rule.label or policy.label_for(call.tool)
        message = default_template("unavailable").render({"label": label}, None)
        verdict = Verdict(rule.name, "unavailable", 0, None, 0, None, 0.0, message, "deny")
        return Decision("deny", call.call_id, message, None, (verdict,), degraded=True)

    def _usage(self, applied: Applied, call: Call, result: OpResult | None) -> Usage:
        rule, limit = applied.rule, applied.limit
        scope = {dim: call.dimension(dim) for dim in rule.per}
        if not isinstance(limit, RateLimit) or result is None:
            return Usage(
                rule.name,
                rule.kind,
                rule.limit.algorithm,
                rule.mode,
                None,
                None,
                0,
                None,
                0.0,
                scope,
            )
        return Usage(
            rule.name,
            rule.kind,
            limit.algorithm,
            rule.mode,
            limit.limit,
            limit.rate.window,
            result.used,
            result.remaining,
            result.reset_after_ms / 1000,
            scope,
        )


def _verdict(policy: Policy, applied: Applied, call: Call, result: OpResult) -> Verdict:
    rule, limit = applied.rule, applied.limit
    assert isinstance(limit, RateLimit)
    retry = None if result.retry_after_ms is None else result.retry_after_ms / 1000
    if result.admitted:
        retry = 0.0
    return Verdict(
        rule=rule.name,
        kind=rule.kind,
        limit=limit.limit,
        window=limit.rate.window,
        remaining=result.remaining,
        retry_after=retry,
        reset_after=result.reset_after_ms / 1000,
        message="" if result.admitted else _message(policy, rule, limit, call, result, retry),
        on_exceed=rule.on_exceed,
    )


def _message(
    policy: Policy, rule: Rule, limit: RateLimit, call: Call, result: OpResult, retry: float | None
) -> str:
    fields = {
        "limit": limit.limit,
        "label": rule.label or policy.label_for(call.tool),
        "window": limit.rate.window,
        "retry_after": retry_text(retry),
        "remaining": result.remaining,
        "user": call.user,
        "tool": call.tool,
        "rule": rule.name,
    }
    return rule.template.render(fields, retry)


def _binding(verdicts: Sequence[Verdict]) -> Verdict:
    """The refusal that holds longest (never, for a limit of 0); the first one on a tie."""
    return max(verdicts, key=lambda v: float("inf") if v.retry_after is None else v.retry_after)
