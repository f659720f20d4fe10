"""Sliding window: an exact log of the last `limit` admission times (twin of sliding_window.lua)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from ratewarden.limiter.algorithms import Check, Table, noop
from ratewarden.limiter.ops import CounterOp


@dataclass(slots=True)
class Ring:
    """The sliding log: admission times oldest first, and the ring's capacity (see Lua)."""

    capacity: int
    stamps: list[int]


def sliding_window(table: Table, op: CounterOp, now: int, call_id: str) -> Check:
    """Exact sliding log; checking never writes, so a refused call or a dry run changes nothing."""
    ring: Ring = table.get(op.key, now) or Ring(op.limit, [])
    stamps, limit = ring.stamps, op.limit
    in_window = len(stamps) - bisect.bisect_right(stamps, now - op.window_ms)
    newest = stamps[-1] if stamps else 0
    check = Check(
        in_window < limit, in_window, 0, newest + op.window_ms - now if in_window else 0, noop
    )
    if limit == 0:
        check.retry_ms = None
    elif not check.admitted:
        check.retry_ms = max(1, stamps[len(stamps) - limit] + op.window_ms - now)

    def commit() -> None:
        if limit == 0:
            return
        stamp = max(now, newest)  # keep the log sorted if time steps back
        if ring.capacity != limit and in_window < limit:
            # A reload changed the limit: resize now, keeping every entry still in the window.
            ring.stamps = [*stamps[len(stamps) - min(len(stamps), limit - 1) :], stamp]
            ring.capacity = limit
        elif len(stamps) < ring.capacity:
            stamps.append(stamp)
        elif ring.capacity < limit:
            stamps.append(stamp)
            ring.capacity = limit
        else:
            del stamps[0]
            stamps.append(stamp)
        table.put(op.key, ring, op.window_ms, now)
        check.used = min(in_window + 1, max(limit, ring.capacity))
        check.reset_ms = op.window_ms

    check.commit = commit
    return check
