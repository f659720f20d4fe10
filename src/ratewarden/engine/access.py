"""Access rules (`deny: "..."`, `ask: "..."`): decided in process, with the counters' answer.

An access rule has no counter, so nothing of it goes to the store. It still takes part in
the one all-or-nothing decision: an enforcing `deny` refuses the call before any counter
is asked (nothing is consumed anywhere); an `ask` has the counters read without consuming
(a call they would refuse anyway is denied now, not approved and then refused), and
`approved: true` lets it past like an `ask` rate rule. Shadow ones are reported, never
enforced.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ratewarden.calls import Call
from ratewarden.engine.decision import Decision, Verdict, scope_of
from ratewarden.policy.model import AccessLimit, Applied, Mode, OnExceed, Policy
from ratewarden.vocabulary import APPROVED_PAST, RuleKind


@dataclass(frozen=True, slots=True)
class AccessGate:
    """The access rules that cover one call, decided; the counted rules left for the store."""

    counted: tuple[Applied, ...]
    refusals: tuple[Verdict, ...]  # enforcing rules that deny or ask, in policy order
    shadow: tuple[Verdict, ...]
    approvals: tuple[Verdict, ...]  # `ask` rules the user's approval lets past

    @classmethod
    def of(cls, policy: Policy, applied: Sequence[Applied], call: Call) -> AccessGate | None:
        """The gate of `call`, or None when no access rule covers it. (The engine asks
        only under a policy that has access rules.)"""
        for candidate in applied:  # a loop, not any(genexpr): on every call of such a policy
            if isinstance(candidate.limit, AccessLimit):
                break
        else:
            return None
        refusals, shadow, approvals = [], [], []
        for access in applied:
            if not isinstance(access.limit, AccessLimit):
                continue
            found = _verdict(policy, access, access.limit, call)
            if access.rule.mode is Mode.SHADOW:
                shadow.append(found)
            elif access.limit.answer is OnExceed.ASK and call.approved:
                approvals.append(found)
            else:
                refusals.append(found)
        counted = tuple(a for a in applied if not isinstance(a.limit, AccessLimit))
        return cls(counted, tuple(refusals), tuple(shadow), tuple(approvals))

    @property
    def refused(self) -> bool:
        """An enforcing `deny` covers the call: no counter needs asking."""
        return any(v.on_exceed == OnExceed.DENY for v in self.refusals)

    @property
    def asking(self) -> bool:
        """Only `ask` rules refuse: the counters say whether it is ask or deny."""
        return bool(self.refusals) and not self.refused

    def decision(self, call: Call) -> Decision:
        """The answer of the access rules alone (nothing counted, nothing consumed)."""
        if not self.refusals:
            return Decision(
                "allow",
                call.call_id,
                shadow=self.shadow,
                approvals=self.approvals,
                warnings=self._notes(),
                approved=call.approved,
            )
        denials = [v for v in self.refusals if v.on_exceed == OnExceed.DENY]
        first = (denials or list(self.refusals))[0]
        return Decision(
            "deny" if denials else "ask",
            call.call_id,
            first.message,
            violations=self.refusals,
            shadow=self.shadow,
        )

    def joined(self, counted: Decision) -> Decision:
        """The counters' decision with the access rules' verdicts in it: an `ask` of
        theirs holds unless a counter denies."""
        joined = replace(
            counted,
            violations=(*self.refusals, *counted.violations),
            shadow=(*self.shadow, *counted.shadow),
            approvals=(*self.approvals, *counted.approvals),
        )
        if self.refusals and counted.decision != "deny":
            return replace(
                joined,
                decision="ask",
                message=self.refusals[0].message,
                retry_after=None,
                approved=False,
                send_result=False,  # asked, not run: nothing was counted
            )
        if counted.decision != "allow":
            return joined  # a refusal's warnings only say what an approval would pass
        return replace(joined, warnings=(*counted.warnings, *self._notes()))

    def _notes(self) -> tuple[str, ...]:
        return tuple(APPROVED_PAST.format(rule=v.rule, message=v.message) for v in self.approvals)


def _verdict(policy: Policy, applied: Applied, limit: AccessLimit, call: Call) -> Verdict:
    rule = applied.rule
    fields = {
        "label": rule.label or policy.label_for(call.tool),
        "user": call.user,
        "tool": call.tool,
        "rule": rule.name,
    }
    return Verdict(
        rule.name,
        RuleKind.ACCESS,
        admitted=False,
        limit=0,
        remaining=0,
        retry_after=None,  # waiting never lifts it
        reset_after=0.0,
        message=rule.template.render(fields, None),
        on_exceed=limit.answer.value,
        scope=scope_of(rule, call),  # nothing counted: `used` stays None
        condition=rule.condition,
    )
