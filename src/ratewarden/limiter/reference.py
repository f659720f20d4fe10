"""The counters in pure Python: the embedded store's engine, and the twin of
`counters.lua`. The conformance suite holds both to the same answers, so a change to
one must be mirrored in the other.

Each counter is looked at without being changed and yields a `Check`; its `commit`
applies the call, and the store commits only if the whole call is allowed.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ratewarden.limiter.ops import (
    CallRecord,
    CounterOp,
    Evaluation,
    Hold,
    Kind,
    OpResult,
    Role,
    blocks,
    to_result,
)


class Table(Protocol):
    """Key/value cells with expiry, as Redis keys behave."""

    def get(self, key: str, now_ms: int) -> Any: ...

    def put(self, key: str, value: Any, ttl_ms: int, now_ms: int) -> None: ...

    def ttl(self, key: str, now_ms: int) -> int: ...


@dataclass(slots=True)
class Check:
    admitted: bool
    used: int
    retry_ms: int | None
    reset_ms: int
    commit: Callable[[], None]
    reserved: int = 0
    save: Callable[[], None] | None = None  # budgets write back their bookkeeping


@dataclass(slots=True)
class Record:
    """An allowed call: its fingerprint, its original answer, and what it holds."""

    fingerprint: str
    numbers: list[int]
    holds: str
    settled: bool = False


def decide(
    table: Table, ops: list[CounterOp], record: CallRecord | None, now: int, dry_run: bool
) -> Evaluation:
    """Evaluate every op, then commit all of them or none (see counters.lua)."""
    if record is not None and not dry_run:
        stored: Record | None = table.get(record.key, now)
        if stored is not None:
            if stored.fingerprint != record.fingerprint:
                return Evaluation(conflict=True)
            return Evaluation(results_from(ops, stored.numbers), replayed=True)
    call_id = record.call_id if record else ""
    checks = [_EVALUATE[op.kind](table, op, now, call_id) for op in ops]
    blocked = blocks(ops, [c.admitted for c in checks])
    numbers: list[int] = []
    holds: list[str] = []
    for op, check in zip(ops, checks, strict=True):
        if not dry_run and not blocked and op.consumes(check.admitted):
            check.commit()
            if op.hold_line:
                holds.append(op.hold_line)
        if check.save:
            check.save()
        retry = -1 if check.retry_ms is None else check.retry_ms
        numbers += [int(check.admitted), check.used, retry, check.reset_ms, check.reserved]
    if record is not None and not dry_run and not blocked and (record.keep or holds):
        table.put(
            record.key, Record(record.fingerprint, numbers, "\n".join(holds)), record.ttl_ms, now
        )
    return Evaluation(results_from(ops, numbers))


def results_from(ops: list[CounterOp], numbers: list[int]) -> list[OpResult]:
    """Results from the raw numbers (5 per op); none if the ops no longer line up."""
    if len(numbers) != 5 * len(ops):
        return []
    n = iter(numbers)  # zipped five times over: each op takes the next five numbers
    return [
        to_result(op, bool(admitted), used, retry, reset, reserved)
        for op, admitted, used, retry, reset, reserved in zip(ops, n, n, n, n, n, strict=True)
    ]


def read_holds(table: Table, record_key: str, now: int) -> list[Hold] | None:
    from ratewarden.limiter.ops import decode_holds

    stored: Record | None = table.get(record_key, now)
    return None if stored is None else decode_holds(stored.holds)


def settle(
    table: Table, record_key: str, call_id: str, actual: int | None, holds: list[Hold], now: int
) -> tuple[int, list[int]]:
    """Release slots, swap reservations for the actual cost (see counters.lua)."""
    stored: Record | None = table.get(record_key, now)
    if stored is None:
        return 2, []
    if stored.settled:
        return 1, []
    charged = []
    for hold in holds:
        if hold.kind is Kind.CONCURRENCY:
            slots: dict[str, int] | None = table.get(hold.key, now)
            if slots is not None:
                slots.pop(call_id, None)
            charged.append(0)
            continue
        state: Budget | None = table.get(hold.key, now)
        if state is None and hold.period[1] == 0:  # gone, and its rule too: nothing to charge
            charged.append(0)
            continue
        state = state or Budget()  # e.g. a call estimated at 0 reserved nothing
        cost = hold.estimate if actual is None else actual
        budget = _load_budget(state, *hold.period, now)
        if call_id in budget.holds:  # still reserved: swap the reservation for the actual cost
            amount, _ = budget.holds.pop(call_id)
            budget.reserved -= amount
            budget.spent += cost
        else:  # already charged at its estimate when it expired: correct by the difference
            budget.spent = max(0, budget.spent + cost - hold.estimate)
        budget.dirty = True
        _save_budget(table, hold.key, budget, 0, now)
        charged.append(cost)
    stored.settled = True
    return 0, charged


# -- rates ---------------------------------------------------------------------------


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


def token_bucket(table: Table, op: CounterOp, now: int, call_id: str) -> Check:
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


def fixed_window(table: Table, op: CounterOp, now: int, call_id: str) -> Check:
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


# -- budgets -------------------------------------------------------------------------


@dataclass(slots=True)
class Budget:
    """A budget counter: its period, spent and reserved money, and open reservations."""

    period: int | None = None
    spent: int = 0
    reserved: int = 0
    holds: dict[str, tuple[int, int]] = field(default_factory=dict)  # call_id -> (amount, expiry)
    finish: int = 0  # end of the current period (not stored in Redis; recomputed)
    dirty: bool = False  # changed since loaded: write it back
    keep: int = 0  # live until then: the period in which the latest reservation expires


def _charge_expired(budget: Budget, upto: int) -> None:
    for call_id, (amount, expiry) in list(budget.holds.items()):
        if expiry <= upto:
            budget.spent += amount
            budget.reserved -= amount
            budget.dirty = True
            del budget.holds[call_id]


def _load_budget(budget: Budget, p0: int, p1: int, p2: int, now: int) -> Budget:
    """Roll the period over if it ended, then charge expired reservations at their estimate."""
    budget.dirty, budget.keep = False, 0
    if p1 == 0:  # period unknown (a settle for a rule since removed): keep the counter's
        start, budget.finish = (now if budget.period is None else budget.period), now
    else:
        start, budget.finish = (p1, p2) if now >= p1 else (p0, p1)
    if budget.period != start:
        if budget.period is not None:  # the period ended: charge what expired in it
            _charge_expired(budget, min(now, start - 1))
            budget.dirty = True
        budget.period, budget.spent = start, 0
    _charge_expired(budget, now)
    return budget


def _save_budget(table: Table, key: str, budget: Budget, min_ttl: int, now: int) -> None:
    if not budget.dirty:
        return
    # Live through the period, every reservation, and the period in which the latest
    # reservation expires, so its charge is still there to be read.
    ttl = max(budget.finish - now, min_ttl, budget.keep - now, 1)
    table.put(key, budget, max(ttl, table.ttl(key, now)), now)


def budget(table: Table, op: CounterOp, now: int, call_id: str) -> Check:
    state = _load_budget(table.get(op.key, now) or Budget(), *op.period, now)
    held = state.spent + state.reserved
    admitted = held < op.limit and held + op.cost <= op.limit
    retry = 0 if admitted else (None if op.cost > op.limit else state.finish - now)
    check = Check(admitted, state.spent, retry, state.finish - now, _noop, reserved=state.reserved)

    def commit() -> None:
        if op.cost > 0:
            expiry = now + op.window_ms
            state.holds[call_id] = (op.cost, expiry)
            state.reserved += op.cost
            state.dirty = True
            if expiry >= state.finish:
                state.keep = expiry + (op.period[2] - op.period[1])
        check.reserved = state.reserved

    check.commit = commit
    check.save = lambda: _save_budget(table, op.key, state, op.window_ms, now)
    return check


# -- concurrency ---------------------------------------------------------------------


def concurrency(table: Table, op: CounterOp, now: int, call_id: str) -> Check:
    """The calls holding a slot, by lease expiry; expired leases are reclaimed."""
    slots: dict[str, int] = table.get(op.key, now) or {}
    for holder, expiry in list(slots.items()):
        if expiry <= now:
            del slots[holder]
    count = len(slots)
    check = Check(count < op.limit, count, 0 if count < op.limit else None, 0, _noop)

    def commit() -> None:
        slots[call_id] = now + op.window_ms
        table.put(op.key, slots, op.window_ms, now)
        check.used = count + 1

    check.commit = commit
    return check


def _noop() -> None:
    return None


_EVALUATE: dict[Kind, Callable[[Table, CounterOp, int, str], Check]] = {
    Kind.SLIDING_WINDOW: sliding_window,
    Kind.TOKEN_BUCKET: token_bucket,
    Kind.FIXED_WINDOW: fixed_window,
    Kind.BUDGET: budget,
    Kind.CONCURRENCY: concurrency,
}

__all__ = ["Check", "Role", "Table", "decide", "read_holds", "settle"]
