"""The counters in pure Python: the embedded store's engine, and the twin of the script.

`decide` and `settle` are the twins of decide.lua and settle.lua; each algorithm is in
`algorithms/`, beside its Lua twin. The conformance suite holds both sides to the same
answers, so a change to one must be mirrored in the other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ratewarden.limiter.algorithms import Check, Table
from ratewarden.limiter.algorithms.budget import (
    MODEL_SPEND,
    MONEY_CEILING,
    Budget,
    DaySpend,
    budget,
    charge,
    load_budget,
    record_spend,
    save_budget,
    spend,
)
from ratewarden.limiter.algorithms.concurrency import concurrency
from ratewarden.limiter.algorithms.fixed_window import fixed_window
from ratewarden.limiter.algorithms.sliding_window import Ring, sliding_window
from ratewarden.limiter.algorithms.token_bucket import token_bucket
from ratewarden.limiter.algorithms.token_window import token_window, token_window_add
from ratewarden.limiter.ops import (
    CallRecord,
    CounterOp,
    Evaluation,
    Hold,
    Kind,
    Recorded,
    Role,
    blocks,
    decode_holds,
)
from ratewarden.limiter.script import SettleStatus, result_key, results_from

_EVALUATE: dict[Kind, Callable[[Table, CounterOp, int, str], Check]] = {
    Kind.SLIDING_WINDOW: sliding_window,
    Kind.TOKEN_BUCKET: token_bucket,
    Kind.FIXED_WINDOW: fixed_window,
    Kind.BUDGET: budget,
    Kind.CONCURRENCY: concurrency,
    Kind.TOKENS: token_window,
}


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
    """Evaluate every op, then commit all of them or none (twin of decide.lua)."""
    if record is not None and record.named and not dry_run:
        answered = answer_from_record(table, ops, record, now)
        if answered is not None:
            return answered
    call_id = record.call_id if record else ""
    checks = [_EVALUATE[op.kind](table, op, now, call_id) for op in ops]
    commit = not dry_run and not blocks(ops, [c.admitted for c in checks])
    numbers, holds = apply(ops, checks, commit)
    if record is not None and commit and (record.named or holds):
        kept = Record(record.fingerprint, numbers, "\n".join(holds))
        table.put(record.key, kept, record.ttl_ms, now)
    return Evaluation(results_from(ops, numbers))


def answer_from_record(
    table: Table, ops: list[CounterOp], record: CallRecord, now: int
) -> Evaluation | None:
    """A repeated check: answered as the first time, consuming nothing; None if new."""
    stored: Record | None = table.get(record.key, now)
    if stored is None:
        return None
    if stored.fingerprint != record.fingerprint:
        return Evaluation(conflict=True)
    if stored.settled:  # a finished call is not run again
        return Evaluation(settled=True)
    return Evaluation(results_from(ops, stored.numbers), replayed=True)


def apply(ops: list[CounterOp], checks: list[Check], commit: bool) -> tuple[list[int], list[str]]:
    """Commit what the call consumes (if `commit`); the numbers of every op, and its holds."""
    numbers: list[int] = []
    holds: list[str] = []
    for op, check in zip(ops, checks, strict=True):
        if commit and op.consumes(check.admitted):
            check.commit()
            if op.hold_line:
                holds.append(op.hold_line)
        if check.save:
            check.save()
        retry = -1 if check.retry_ms is None else check.retry_ms
        numbers += [int(check.admitted), check.used, retry, check.reset_ms, check.reserved]
    return numbers, holds


def read_holds(table: Table, record_key: str, now: int) -> Recorded | None:
    stored: Record | None = table.get(record_key, now)
    return None if stored is None else Recorded(decode_holds(stored.holds), stored.fingerprint)


def settle(
    table: Table,
    record_key: str,
    call_id: str,
    actual: int | None,
    holds: list[Hold],
    now: int,
    fingerprint: str = "",
    digest: str | None = None,
    model: bool = False,
) -> tuple[SettleStatus, list[int]]:
    """Release slots, swap reservations for the actual cost, add tokens to token rates,
    compare the result `digest` with a loop rule's last one (twin of settle.lua). With a
    `fingerprint`, a record of another fingerprint is as unknown. A `model` call's
    settle adds what it moved on each budget to that day's model record too."""
    stored: Record | None = table.get(record_key, now)
    if stored is None or (fingerprint and stored.fingerprint != fingerprint):
        return SettleStatus.UNKNOWN, []
    if stored.settled:
        return SettleStatus.ALREADY_SETTLED, []
    charged = []
    for hold in holds:
        if hold.loop:
            settle_loop(table, hold, call_id, digest, now)
            charged.append(0)
            continue
        if hold.kind is Kind.TOKENS:  # the call's tokens (estimate) into its window
            token_window_add(table, hold.key, hold.period[1], hold.estimate, now)
            charged.append(0)
            continue
        if hold.kind is Kind.CONCURRENCY:
            slots: dict[str, int] | None = table.get(hold.key, now)
            if slots is not None:
                slots.pop(call_id, None)
            charged.append(0)
            continue
        charged.append(settle_budget(table, hold, call_id, actual, now, model))
    stored.settled = True
    return SettleStatus.SETTLED, charged


def settle_budget(
    table: Table, hold: Hold, call_id: str, actual: int | None, now: int, model: bool
) -> int:
    """Swap a budget hold's reservation for the actual cost; what it charged (twin of
    settle.lua's `settle_hold`). A `model` call's settle adds what it moved to the day's
    model record too: for a reservation charged at its estimate when it expired in this
    period, that charge as well (the call's whole cost)."""
    state: Budget | None = table.get(hold.key, now)
    if state is None and hold.period[1] == 0:  # gone, and its rule too: nothing to charge
        return 0
    state = state or Budget()  # e.g. a call estimated at 0 reserved nothing
    cost = hold.estimate if actual is None else actual
    budget = load_budget(state, *hold.period, now)
    before = budget.charged_now  # what the load charged (expired reservations): not ours
    if call_id in budget.holds:  # still reserved: swap the reservation for the actual cost
        amount, _ = budget.holds.pop(call_id)
        budget.reserved -= amount
        charge(budget, cost)
    elif call_id in budget.charged:  # charged when it expired, in this period: correct it
        expired = budget.charged.pop(call_id)
        charge(budget, cost - expired)
        before -= expired  # the model record takes the call's whole cost
    else:  # charged in an earlier period (or nothing reserved): only an excess lands here
        charge(budget, max(0, cost - hold.estimate))
    budget.dirty = True
    moved = budget.charged_now - before
    save_budget(table, hold.key, budget, 0, now)
    if model:
        record_spend(table, hold.key, moved, now, MODEL_SPEND)
    return cost


def sweep(table: Table, key: str, period: tuple[int, int, int], now: int) -> int:
    """A budget counter whose earliest reservation expiry is due is loaded and saved, as
    a check of its scope would: what expired is charged at its estimate, and into the
    day's spend record. `period`: its rule's in force (zeros: gone). What it charged
    (twin of settle.lua's `sweep`); a counter with nothing due is not written."""
    state: Budget | None = table.get(key, now)
    if state is None or not any(expiry <= now for _, expiry in state.holds.values()):
        return 0
    budget = load_budget(state, *period, now)
    charged = budget.charged_now
    save_budget(table, key, budget, 0, now)
    return charged


def settle_loop(table: Table, hold: Hold, call_id: str, digest: str | None, now: int) -> None:
    """A loop hold: a result other than the one kept restarts the count, this call its
    first unit; then the result is kept (twin of settle.lua's `settle_loop`)."""
    limit, window_ms, burst = hold.period
    if not digest or window_ms == 0:  # no result, or the rule is gone
        return
    kept_key = result_key(hold.key)
    kept: str | None = table.get(kept_key, now)
    if kept is not None and kept != digest:
        table.delete(hold.key)
        op = CounterOp(hold.key, hold.kind, Role.ENFORCE, limit, window_ms, burst)
        _EVALUATE[hold.kind](table, op, now, call_id).commit()
    table.put(kept_key, digest, window_ms, now)


__all__ = [
    "MONEY_CEILING",
    "Budget",
    "Check",
    "DaySpend",
    "Record",
    "Ring",
    "Table",
    "decide",
    "read_holds",
    "settle",
    "spend",
    "sweep",
]
