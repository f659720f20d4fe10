"""Budgets: spent and reserved money per period, reserve then settle (twin of budget.lua)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ratewarden.limiter.algorithms import Check, Table, noop
from ratewarden.limiter.ops import CounterOp

DAY_MS = 86_400_000  # a spend record's day: UTC, by the store's clock

# Money never wraps (see budget.lua): spent saturates here and stays until the period
# ends, a reservation takes at most what is left below it; no budget is larger.
MONEY_CEILING = 10**15  # micro-units: the largest budget (policy.durations.MAX_AMOUNT)
# A counter outlives its latest reservation's expiry by this much, so the budget sweep
# (service/sweep.py, every RATEWARDEN_SWEEP_INTERVAL_S, at most MAX_SWEEP_INTERVAL_S)
# sees it due at three ticks at least (budget.lua's SWEEP_GRACE_MS).
MAX_SWEEP_INTERVAL_S = 300
SWEEP_GRACE_MS = 3 * MAX_SWEEP_INTERVAL_S * 1000


def spend(spent: int, delta: int) -> int:
    """`spent` plus `delta` (which may be negative), saturating at the ceiling."""
    if spent >= MONEY_CEILING:
        return MONEY_CEILING
    return min(max(0, spent + delta), MONEY_CEILING)


@dataclass(slots=True)
class Budget:
    """A budget counter: its period, spent and reserved money, and open reservations."""

    period: int | None = None
    spent: int = 0
    reserved: int = 0
    # call_id -> (amount, expiry): one per call, so `reserved` is always their sum
    holds: dict[str, tuple[int, int]] = field(default_factory=dict)
    # call_id -> amount charged in this period when its reservation expired unsettled
    charged: dict[str, int] = field(default_factory=dict)
    finish: int = 0  # end of the current period (not stored in Redis; recomputed)
    dirty: bool = False  # changed since loaded: write it back
    keep: int = 0  # live until then: the period in which the latest reservation expires
    # what this load changed spent by (not stored): added to the day's spend record on save
    charged_now: int = 0


@dataclass(slots=True)
class DaySpend:
    """A budget counter's spend record of one UTC day: what it charged, in micro-units."""

    amount: int = 0


MODEL_SPEND = ":m"  # a spend record's suffix for the part model calls' settles charged


def spend_key(counter_key: str, day: int, suffix: str = "") -> str:
    """`rw:spend:{<the counter's tag>}:<day>` for the counter `rw:{<tag>}:bg` (keys.py);
    with MODEL_SPEND, the day's model record beside it."""
    return f"rw:spend:{counter_key[3:-3]}:{day}{suffix}"


def charge(budget: Budget, delta: int) -> None:
    """Spent plus `delta`, and what it really moved, for the day's record."""
    spent = spend(budget.spent, delta)
    budget.charged_now += spent - budget.spent
    budget.spent = spent


def record_spend(table: Table, key: str, amount: int, now: int, suffix: str = "") -> None:
    """Add `amount` to the counter's spend record of today (kept the table's retention);
    with MODEL_SPEND, to its model record."""
    days = table.spend_retention_days
    if days == 0 or amount == 0:
        return
    day = now // DAY_MS
    record = spend_key(key, day, suffix)
    found: DaySpend | None = table.get(record, now)
    total = (found.amount if found else 0) + amount
    table.put(record, DaySpend(total), (day + 1 + days) * DAY_MS - now, now)


def charge_expired(budget: Budget, upto: int, mark: bool) -> None:
    for call_id, (amount, expiry) in list(budget.holds.items()):
        if expiry <= upto:
            charge(budget, amount)
            budget.reserved -= amount
            budget.dirty = True
            del budget.holds[call_id]
            if mark:
                budget.charged[call_id] = amount


def load_budget(budget: Budget, p0: int, p1: int, p2: int, now: int) -> Budget:
    """Roll the period over if it ended, then charge expired reservations at their estimate."""
    budget.dirty, budget.keep, budget.charged_now = False, 0, 0
    if p1 == 0:  # period unknown (a settle for a rule since removed): keep the counter's
        start, budget.finish = (now if budget.period is None else budget.period), now
    else:
        start, budget.finish = (p1, p2) if now >= p1 else (p0, p1)
    if budget.period != start:
        if budget.period is not None:  # the period ended: charge what expired in it
            charge_expired(budget, min(now, start - 1), mark=False)
            budget.charged.clear()  # no correction may reach back past a new period
            budget.dirty = True
        budget.period, budget.spent = start, 0
    charge_expired(budget, now, mark=True)
    return budget


def save_budget(table: Table, key: str, budget: Budget, min_ttl: int, now: int) -> None:
    if not budget.dirty:
        return
    record_spend(table, key, budget.charged_now, now)
    budget.charged_now = 0  # recorded: a second save of the same load adds nothing
    # Live through the period, every reservation, and the period in which the latest
    # reservation expires, so its charge is still there to be read.
    ttl = max(budget.finish - now, min_ttl, budget.keep - now, 1)
    budget.keep = 0  # this load's, as `charged_now`: the cell keeps its TTL, not this
    table.put(key, budget, max(ttl, table.ttl(key, now)), now)


def budget(table: Table, op: CounterOp, now: int, call_id: str) -> Check:
    state = load_budget(table.get(op.key, now) or Budget(), *op.period, now)
    held = state.spent + state.reserved
    admitted = held < op.limit and held + op.cost <= op.limit
    retry = 0 if admitted else (None if op.cost > op.limit else state.finish - now)
    check = Check(admitted, state.spent, retry, state.finish - now, noop, reserved=state.reserved)

    def commit() -> None:
        if state.reserved > 0:  # one reservation per call: checked again, it replaces its last one
            held = state.holds.pop(call_id, None)
            if held is not None:
                state.reserved -= held[0]
                state.dirty = True
        if op.cost > 0:
            expiry, amount = now + op.window_ms, min(op.cost, MONEY_CEILING - state.reserved)
            state.holds[call_id] = (amount, expiry)
            state.reserved += amount
            state.dirty = True
            keep = expiry + SWEEP_GRACE_MS  # the sweep must still find it due
            if expiry >= state.finish:
                keep = max(keep, expiry + (op.period[2] - op.period[1]))
            state.keep = max(state.keep, keep)
        check.reserved = state.reserved

    check.commit = commit
    check.save = lambda: save_budget(table, op.key, state, op.window_ms, now)
    return check
