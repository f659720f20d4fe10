"""What a reset (`POST /v1/admin/reset`) forgets, and its record: an audit line and a metric.

A reset deletes counters: for a budget, money spent and reserved is forgotten. So the
operator's change is recorded as runtime overrides are (overrides.py): who (the admin
token's name), what (user, rule) and the values the counters held.

The values are read, then deleted: two store steps, not one. A call admitted between the
two is deleted with the rest and missing from the record (it is at most the calls of one
round trip); reading and deleting in one script would need the store to parse every
algorithm's counter, for a record that is already exact whenever the user is idle, as
during an operator's reset. Only a reset that names a user reads anything: that user's
counters kept per user alone (`GET /v1/usage?user=` shows the same ones). A rule reset
for every user reads nothing before it: its record says how many counters it deleted.
"""

from __future__ import annotations

from datetime import UTC, datetime

from ratewarden.engine import Engine
from ratewarden.engine.decision import Usage
from ratewarden.service.audit import admin_change
from ratewarden.service.metrics import Metrics
from ratewarden.wire.bodies import ForgottenCounter, ResetResponse, held_by_user


async def read_before(
    engine: Engine, user: str | None, rule: str | None
) -> list[ForgottenCounter] | None:
    """The counters of `user` (one `rule`, or all) that hold something; None without a user."""
    if user is None:
        return None
    found = await engine.usage(user)
    return [
        _forgotten(item)
        for item in found
        if (rule is None or item.rule == rule) and held_by_user(item)
    ]


def _forgotten(item: Usage) -> ForgottenCounter:
    return ForgottenCounter(
        rule=item.rule,
        kind=item.kind,
        used=item.used,
        reserved=item.reserved,
        currency=item.currency,
    )


def recorded(
    metrics: Metrics,
    engine: Engine,
    who: str,
    request: tuple[str | None, str | None],
    answer: ResetResponse,
) -> ResetResponse:
    """Audit and count the reset of `request` (user, rule) that gave `answer`; return it."""
    user, rule = request
    metrics.resets.labels(_target(user, rule)).inc()
    forgotten = None if answer.forgotten is None else [f.model_dump() for f in answer.forgotten]
    admin_change(
        "counters_reset",
        by=who,
        user=user,
        rule=rule,
        deleted=answer.deleted,
        forgotten=forgotten,
        at=datetime.fromtimestamp(engine.clock.now_ms() / 1000, UTC).isoformat(),
    )
    return answer


def _target(user: str | None, rule: str | None) -> str:
    """The metric's label: never the user's name (unbounded), only what kind of reset."""
    if user is None:
        return "rule"
    return "user" if rule is None else "user_rule"
