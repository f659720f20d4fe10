"""Token bucket as GCRA (twin of token_bucket.lua)."""

from __future__ import annotations

import math

from ratewarden.limiter.algorithms import Check, Table, noop
from ratewarden.limiter.ops import CounterOp


def token_bucket(table: Table, op: CounterOp, now: int, call_id: str) -> Check:
    """GCRA: the cell holds the theoretical arrival time (TAT) in ms."""
    if op.limit == 0:
        return Check(False, 0, None, 0, noop)
    interval = op.window_ms / op.limit
    burst = op.burst
    stored = table.get(op.key, now)
    tat = max(stored if stored is not None else now, now)
    new_tat = tat + interval
    allow_at = new_tat - burst * interval
    admitted = now >= allow_at
    check = Check(admitted, 0, 0 if admitted else max(1, math.ceil(allow_at - now)), 0, noop)

    def settle(t: float) -> None:
        remaining = max(0, min(burst, math.floor((now + burst * interval - t) / interval)))
        check.used = burst - remaining
        check.reset_ms = max(0, math.ceil(t - now))

    def commit() -> None:
        table.put(op.key, new_tat, max(1, math.ceil(new_tat - now)), now)
        settle(new_tat)

    settle(tat)
    check.commit = commit
    return check
