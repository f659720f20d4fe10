"""What the service reports about each decision: metrics and the audit trail."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ratewarden.audit import AuditTrail
from ratewarden.calls import Call
from ratewarden.engine import Decision, Settlement
from ratewarden.metrics import Metrics
from ratewarden.policy import Policy


@dataclass(frozen=True, slots=True)
class Observer:
    metrics: Metrics
    audit: AuditTrail

    def checked(
        self,
        decision: Decision,
        call: Call,
        args: dict[str, Any] | None,
        policy: Policy,
        seconds: float,
    ) -> None:
        self.metrics.observe_check(decision, call, policy, seconds)
        self.audit.record(decision, call, args)

    def settled(self, settlement: Settlement, policy: Policy) -> None:
        self.metrics.observe_settle(settlement, policy)
