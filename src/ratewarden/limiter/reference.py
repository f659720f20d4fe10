"""The decision algorithms in pure Python: the embedded store's engine, and the twin
of `decide.lua`. Both are held to the same decisions by the conformance suite, so a
change to one must be mirrored in the other.

Each algorithm looks at a counter without changing it and returns a `Check` whose
`commit` applies the call; the store commits only if the whole call is allowed.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from ratewarden.limiter.ops import CounterOp, OpResult, Role, blocks
from ratewarden.policy.model import Algorithm


class Table(Protocol):
    """Key/value cells with expiry, as a Redis string key behaves."""

    def get(self, key: str, now_ms: int) -> Any: ...

    def put(self, key: str, value: Any, ttl_ms: int, now_ms: int) -> None: ...


@dataclass(slots=True)
class Check:
    admitted: bool
    used: int
    retry_ms: int | None
    reset_ms: int
    commit: Callable[[], None]


def decide(table: Table, ops: list[CounterOp], now_ms: int, dry_run: bool) -> list[OpResult]:
    """Evaluate every op, then commit all of them or none (see decide.lua)."""
    checks = [_ALGORITHMS[op.algorithm](table, op, now_ms) for op in ops]
    blocked = blocks(ops, [c.admitted for c in checks])
    results = []
    for op, check in zip(ops, checks, strict=True):
        if not dry_run and not blocked and op.consumes(check.admitted):
            check.commit()
        results.append(to_result(op, check.admitted, check.used, check.retry_ms, check.reset_ms))
    return results


def to_result(
    op: CounterOp, admitted: bool, used: int, retry_ms: int | None, reset_ms: int
) -> OpResult:
    capacity = op.burst if op.algorithm is Algorithm.TOKEN_BUCKET else op.limit
    return OpResult(admitted, used, max(0, capacity - used), retry_ms, reset_ms)


@dataclass(slots=True)
class Ring:
    """The sliding log: admission times oldest first, and the ring's capacity (see Lua)."""

    capacity: int
    stamps: list[int]


def sliding_window(table: Table, op: CounterOp, now: int) -> Check:
    """Exact sliding log; checking never writes, so a refused call or a dry run changes nothing."""
    ring: Ring = table.get(op.key, now) or Ring(op.limit, [])
    stamps, limit = ring.stamps, op.limit
    in_window = len(stamps) - bisect.bisect_right(stamps, now - op.window_ms)
    newest = stamps[-1] if stamps else 0
    check = Check(
        in_window < limit, in_window, 0, newest + op.window_ms - now if in_window else 0, _noop
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


def token_bucket(table: Table, op: CounterOp, now: int) -> Check:
    """GCRA: the cell holds the theoretical arrival time (TAT) in ms."""
    if op.limit == 0:
        return Check(False, 0, None, 0, _noop)
    interval = op.window_ms / op.limit
    burst = op.burst
    stored = table.get(op.key, now)
    tat = max(stored if stored is not None else now, now)
    new_tat = tat + interval
    allow_at = new_tat - burst * interval
    admitted = now >= allow_at
    check = Check(admitted, 0, 0 if admitted else max(1, math.ceil(allow_at - now)), 0, _noop)

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


def fixed_window(table: Table, op: CounterOp, now: int) -> Check:
    """Clock-aligned windows, as envoy's ratelimit counts; the cell holds (start, count)."""
    start = now - now % op.window_ms
    stored = table.get(op.key, now)
    count = stored[1] if stored is not None and stored[0] == start else 0
    admitted = count < op.limit
    ends_in = start + op.window_ms - now
    retry = None if op.limit == 0 else (0 if admitted else ends_in)
    check = Check(admitted, count, retry, ends_in if count else 0, _noop)

    def commit() -> None:
        table.put(op.key, (start, count + 1), ends_in, now)
        check.used = count + 1
        check.reset_ms = ends_in

    check.commit = commit
    return check


def _noop() -> None:
    return None


_ALGORITHMS: dict[Algorithm, Callable[[Table, CounterOp, int], Check]] = {
    Algorithm.SLIDING_WINDOW: sliding_window,
    Algorithm.TOKEN_BUCKET: token_bucket,
    Algorithm.FIXED_WINDOW: fixed_window,
}

__all__ = ["Check", "Role", "Table", "decide"]
