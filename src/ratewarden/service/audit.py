"""The audit trail: one JSON line per notable decision, and a list of recent ones.

Notable: a deny, an ask, a shadow rule that would have blocked, an approved ask. Each is
written to the audit log at once, and queued for the store's bounded recent-denials
list (`GET /v1/denials`), which a background task fills in batches: a decision never
waits for it, so deciding stays one round trip. The same flush adds each entry to its
user's own list (`USER_DENIALS`: so many per user, for so many users), which `GET
/v1/denials?user=` reads beside the shared list: one looping agent fills the shared list
within seconds, never another user's own.

A call's `args` are never written unless the operator sets RATEWARDEN_AUDIT_ARGS=true.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from ratewarden.calls import Call
from ratewarden.clock import Clock, SystemClock
from ratewarden.engine import Decision, Verdict
from ratewarden.service.stopping import Stopping
from ratewarden.store import Store, StoreError
from ratewarden.store.base import UserDenialCaps
from ratewarden.store.breaker import CircuitOpenError
from ratewarden.store.keys import USER_DENIALS_KEEP, USER_DENIALS_TTL_MS, USER_DENIALS_USERS
from ratewarden.vocabulary import Dimension

log = logging.getLogger("ratewarden.audit")
RECENT_LIMIT = 1000  # entries kept in the recent-denials list
USER_DENIALS = UserDenialCaps(USER_DENIALS_KEEP, USER_DENIALS_USERS, USER_DENIALS_TTL_MS)
_FLUSH_EVERY_S = 0.2
_STOP_WAIT_S = 5.0  # for the flush under way at shutdown (its store call has a deadline)


def new_entry_id() -> str:
    return uuid.uuid4().hex


def audit_entry(
    decision: Decision,
    call: Call,
    args: dict[str, Any] | None,
    *,
    now_ms: int,
    entry_id: str,
) -> dict[str, Any] | None:
    """The audit record of `decision` at `now_ms`, or None when there is nothing to audit."""
    event = _event(decision)
    if event is None:
        return None
    # An approval is named after the rules it was let past; anything else after its refusals.
    approved = event == "approved"
    verdicts = decision.approvals if approved else decision.violations or decision.shadow
    first = worded(decision, verdicts)
    entry: dict[str, Any] = {
        "id": entry_id,
        "time": datetime.fromtimestamp(now_ms / 1000, UTC).isoformat(timespec="milliseconds"),
        "event": event,
        "decision": decision.decision,
        "user": call.user,
        "tool": call.tool,
        "host_tool": call.host_tool,  # the host's own name for it (None: the same)
        "session": call.session,
        "team": call.team,
        "call_id": call.call_id,
        "rule": first.rule if first else None,
        "rules": [v.rule for v in verdicts],
        "reason": first.kind if first else None,
        "message": decision.message or (first.message if first else ""),
        "retry_after": decision.retry_after,
        "degraded": decision.degraded,
        "violations": [_detail(v, args is not None) for v in verdicts],
    }
    if args is not None:
        entry["args"] = args
    return entry


def worded(decision: Decision, verdicts: Sequence[Verdict]) -> Verdict | None:
    """The verdict a record is named after: the one whose sentence the decision carries
    (the binding refusal, which need not be the first to refuse), else the first. So a
    record's `rule`, `reason` and `message` are one rule's, as the hook's detail line is."""
    if decision.message:
        for found in verdicts:
            if found.message == decision.message:
                return found
    return verdicts[0] if verdicts else None


# What the audit keeps of each verdict: the wire `Violation`'s fields (wire/bodies.py).
_DETAIL = (
    "rule", "kind", "scope", "limit", "used", "remaining", "retry_after", "window",
    "condition", "spent", "reserved", "currency", "period", "message",
)  # fmt: skip
HIDDEN = "(args not audited)"


def _detail(found: Verdict, with_args: bool) -> dict[str, Any]:
    """A verdict's structured detail, as the response carries it. A scope's `args`
    dimensions hold a digest of the call's arguments: an unsalted hash of a short value
    can be guessed, so it is written only where the operator audits arguments."""
    detail = {name: getattr(found, name) for name in _DETAIL}
    scope = found.scope
    if scope and not with_args:
        detail["scope"] = {
            dim: HIDDEN if dim.startswith(Dimension.ARGS) and value is not None else value
            for dim, value in scope.items()
        }
    return detail


def _names(entry: dict[str, Any], tool: str) -> bool:
    """Whether an entry is of `tool`, by its canonical name or its host's own."""
    return tool in (entry["tool"], entry.get("host_tool"))


def _json_line(entry: dict[str, Any]) -> str:
    """`entry` as one line of standard JSON, ASCII only: any log destination can take it,
    whatever its locale, and any JSON parser can read it (never NaN or Infinity)."""
    try:
        return json.dumps(entry, ensure_ascii=True, default=str, allow_nan=False)
    except ValueError:  # `args` with them are refused (wire/bodies.py): a figure of ours, a bug
        return json.dumps(_finite(entry), ensure_ascii=True, default=str, allow_nan=False)


def _finite(value: Any) -> Any:
    """`value` with each number that is not finite written as its name ("nan", "inf")."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def _event(decision: Decision) -> str | None:
    if decision.decision in ("deny", "ask"):
        return decision.decision
    if decision.replayed:
        return None
    if decision.approvals:
        return "approved"
    return "shadow_deny" if decision.shadow else None


def admin_change(event: str, **fields: Any) -> None:
    """One audit line for an operator's change (an override set or removed): who, what,
    when. Only the audit log: the recent-denials list is about calls."""
    log.info(_json_line({"event": event, **fields}))


class AuditTrail:
    """Writes audit lines and keeps the store's recent-denials list filled."""

    def __init__(
        self,
        store: Store,
        include_args: bool = False,
        *,
        clock: Clock | None = None,
        new_id: Callable[[], str] = new_entry_id,
    ) -> None:
        self.store = store
        self.include_args = include_args
        self.clock = clock or SystemClock()  # injected by tests, as the id maker is
        self.new_id = new_id
        self._pending: list[tuple[str, str]] = []  # (user, audit line)
        self._task: asyncio.Task[None] | None = None
        self._stopping = Stopping()

    def record(self, decision: Decision, call: Call, args: dict[str, Any] | None) -> None:
        if _event(decision) is None:
            return  # most calls: no clock read, no id (a uuid4 is 3 us of every request)
        kept = args if self.include_args else None
        entry = audit_entry(
            decision, call, kept, now_ms=self.clock.now_ms(), entry_id=self.new_id()
        )
        assert entry is not None  # it has an event
        line = _json_line(entry)
        log.info(line)
        self._pending.append((call.user, line))

    async def recent(
        self,
        user: str | None = None,
        tool: str | None = None,
        rule: str | None = None,
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        """Newest first, filtered; what this process queued is flushed first. A user's
        entries are their own list's and the shared list's, together (either may hold
        some the other has lost)."""
        await self.flush()
        lines = await self.store.recent_denials(RECENT_LIMIT)
        if user:  # after the shared list's: its order stands where times are equal
            lines += await self.store.user_denials(user, USER_DENIALS.keep)
        found: dict[str, dict[str, Any]] = {}
        for line in lines:
            entry = json.loads(line)
            if (user and entry["user"] != user) or (tool and not _names(entry, tool)):
                continue
            if rule and rule not in entry["rules"]:
                continue
            found.setdefault(entry["id"], entry)
        newest = sorted(found.values(), key=lambda e: e["time"], reverse=True)
        return newest[:limit]

    async def flush(self) -> None:
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        try:
            await self.store.push_denials([line for _, line in batch], RECENT_LIMIT)
            await self.store.push_user_denials(batch, self.clock.now_ms(), USER_DENIALS)
        except StoreError as exc:  # the log lines are written; only the lists miss them
            # With the circuit open the breaker has said so once; one line per flush
            # (five a second) would drown the log for the whole outage.
            level = logging.DEBUG if isinstance(exc, CircuitOpenError) else logging.WARNING
            logging.getLogger("ratewarden").log(level, "recent denials not stored: %s", exc)

    def start(self) -> None:
        self._stopping = Stopping()
        self._task = asyncio.create_task(self._flush_forever())

    async def stop(self) -> None:
        """Let the flusher finish the flush it is in (the store call has its deadline)
        rather than cancel it mid-command: a cancel that met the store deadline's own
        could be taken for the deadline's and swallowed, and the flusher then ran on
        while this waited for it for ever (a hang seen at shutdown in the test suite)."""
        if self._task:
            self._stopping.set()
            try:
                await asyncio.wait_for(self._task, _STOP_WAIT_S)
            except TimeoutError:  # wait_for has cancelled it: it is gone either way
                logging.getLogger("ratewarden").warning("audit flusher cancelled at shutdown")
            self._task = None
        await self.flush()

    async def _flush_forever(self) -> None:
        while not self._stopping.is_set():
            await self._stopping.nap(_FLUSH_EVERY_S)
            await self.flush()
