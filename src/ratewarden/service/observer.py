"""What the service reports about each decision: metrics, the audit trail, and
notifications (a decision with a refusal or a warning only: two truth tests for the rest)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ratewarden.calls import Call
from ratewarden.engine import Decision, Settlement
from ratewarden.engine.refusals import RefusalCache
from ratewarden.policy import Policy
from ratewarden.service.activity import Tally
from ratewarden.service.audit import AuditTrail
from ratewarden.service.metrics import Metrics
from ratewarden.service.notify import Notifier


@dataclass(frozen=True, slots=True)
class Observer:
    metrics: Metrics
    audit: AuditTrail
    # The engine's remembered refusals: a decision does not say whether it came from them,
    # their count of answers does (read after each decision, for the metric).
    refusals: RefusalCache | None = None
    # Who is blocked (service/activity.py): counted here, flushed to the store apart.
    activity: Tally | None = None
    notifier: Notifier | None = None

    def checked(
        self,
        decision: Decision,
        call: Call,
        args: dict[str, Any] | None,
        policy: Policy,
        seconds: float,
    ) -> None:
        self.metrics.observe_check(decision, call, policy, seconds)
        if self.refusals is not None and not decision.allowed:  # only refusals come from it
            self.metrics.remembered_refusals(self.refusals.hits)
        self.audit.record(decision, call, args)
        if self.activity is not None:
            self.activity.count(decision, call)
        if (decision.violations or decision.warnings) and self.notifier is not None:
            self.notifier.decided(decision, call, policy)

    def settled(self, settlement: Settlement, policy: Policy) -> None:
        self.metrics.observe_settle(settlement, policy)
