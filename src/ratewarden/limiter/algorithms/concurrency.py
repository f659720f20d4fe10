"""Concurrency: the calls holding a slot, by lease expiry (twin of concurrency.lua)."""

from __future__ import annotations

from ratewarden.limiter.algorithms import Check, Table, noop
from ratewarden.limiter.ops import CounterOp


def concurrency(table: Table, op: CounterOp, now: int, call_id: str) -> Check:
    """The calls holding a slot, by lease expiry; expired leases are reclaimed."""
    slots: dict[str, int] = table.get(op.key, now) or {}
    for holder, expiry in list(slots.items()):
        if expiry <= now:
            del slots[holder]
    count = len(slots)
    check = Check(count < op.limit, count, 0 if count < op.limit else None, 0, noop)

    def commit() -> None:
        slots[call_id] = now + op.window_ms
        table.put(op.key, slots, op.window_ms, now)
        check.used = count + 1

    check.commit = commit
    return check
