"""Fixed window: clock-aligned windows (twin of fixed_window.lua)."""

from __future__ import annotations

from ratewarden.limiter.algorithms import Check, Table, noop
from ratewarden.limiter.ops import CounterOp


def fixed_window(table: Table, op: CounterOp, now: int, call_id: str) -> Check:
    """Clock-aligned windows, as envoy's ratelimit counts; the cell holds (start, count)."""
    start = now - now % op.window_ms
    stored = table.get(op.key, now)
    count = stored[1] if stored is not None and stored[0] == start else 0
    admitted = count < op.limit
    ends_in = start + op.window_ms - now
    retry = None if op.limit == 0 else (0 if admitted else ends_in)
    check = Check(admitted, count, retry, ends_in if count else 0, noop)

    def commit() -> None:
        table.put(op.key, (start, count + 1), ends_in, now)
        check.used = count + 1
        check.reset_ms = ends_in

    check.commit = commit
    return check
