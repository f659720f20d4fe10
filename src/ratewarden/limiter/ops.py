"""What the engine asks a store to do, and what the store answers.

A call becomes a list of `CounterOp`s, one per matching rule. A store evaluates all of
them and then commits all or none, in one atomic step. An allowed call that holds
something (a budget reservation, a concurrency slot), that a loop rule keyed on results
counted (its settle brings the result), or that the caller named with a `call_id` leaves
a record, so a repeated check is answered from it and a settle knows what to do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, StrEnum


class Kind(StrEnum):
    """A counter's arithmetic, by the short code the Lua script knows it by."""

    SLIDING_WINDOW = "sw"
    TOKEN_BUCKET = "tb"
    FIXED_WINDOW = "fw"
    BUDGET = "bg"
    CONCURRENCY = "cc"
    TOKENS = "tk"  # a token rate: a clock-aligned window of model tokens, added at settle


HOLDING = (Kind.BUDGET, Kind.CONCURRENCY)  # kinds a call holds until it settles
# A token rate holds nothing (its check takes nothing, so nothing expires or is released
# unsettled, and the record needs no TTL past the policy's call_ttl), but its op carries
# a hold line all the same: the call's settle adds its tokens to the counter.
SETTLED_KINDS = (*HOLDING, Kind.TOKENS)  # kinds whose ops carry a hold line (rule set)
# A loop rule keyed on results (`same_result: true`) is a rate counter whose ops carry a
# hold line too: nothing is held, but the call's settle must find the counter to compare
# its result with the last one kept (a "loop hold", of a rate kind).
RATE_KINDS = (Kind.SLIDING_WINDOW, Kind.TOKEN_BUCKET, Kind.FIXED_WINDOW)


class Role(IntEnum):
    """How one op's verdict weighs on the call."""

    SHADOW = 0  # never blocks; consumes only when it would have admitted the call
    ENFORCE = 1  # blocks the whole call when it does not admit it
    FORCED = 2  # an approved `ask` rule: never blocks, always consumes


@dataclass(slots=True)  # built per call: not frozen, whose __init__ costs 5x; never mutated
class CounterOp:
    key: str
    kind: Kind
    role: Role
    limit: int  # calls per window, slots, or budget in micro-units
    window_ms: int = 0  # rate window; lease timeout (concurrency); reservation TTL (budget)
    burst: int = 0  # token bucket capacity
    cost: int = 0  # budget: the estimate to reserve, in micro-units
    period: tuple[int, int, int] = (0, 0, 0)  # budget: period start, end, next period's end
    # Set on ops a settle must reach (budget, concurrency, tokens, a loop rule keyed on results):
    # recorded with them, so a settle can find the rule again. Empty on any other.
    rule: str = ""

    @property
    def hold_line(self) -> str:
        """How the call's record lists this op if its settle must reach it."""
        if not self.rule:
            return ""
        return _hold_line(self.kind, self.cost, self.rule, self.key)

    def consumes(self, admitted: bool) -> bool:
        """Whether this op takes its unit once the call as a whole is allowed (and so
        is listed in the call's record). A token rate takes nothing at its check, but is
        listed whatever its verdict: a shadow one's settle still adds the tokens."""
        return admitted or self.role is Role.FORCED or self.kind is Kind.TOKENS

    @property
    def capacity(self) -> int:
        return self.burst if self.kind is Kind.TOKEN_BUCKET else self.limit


@dataclass(slots=True)  # built per call: not frozen, whose __init__ costs 5x; never mutated
class OpResult:
    """One counter's answer; `used`/`reserved` are after this call was counted (or not)."""

    admitted: bool
    used: int  # calls in the window, slots in use, or money spent (micro-units)
    remaining: int
    retry_after_ms: int | None  # until this counter would admit; None = not by waiting
    reset_after_ms: int  # until the counter is back to empty (or the budget period ends)
    reserved: int = 0  # budget: money reserved by calls not yet settled


@dataclass(slots=True)  # built per call: not frozen, whose __init__ costs 5x; never mutated
class CallRecord:
    """Where an allowed call is recorded, and whether it must be."""

    key: str
    call_id: str
    fingerprint: str  # what shapes the decision: a call_id reused for another call is refused
    ttl_ms: int
    # The caller chose the call_id (an idempotency key): a check of it may be a replay, so
    # its record is read first, and the call is recorded even without held ops. An id the
    # daemon made up is new by construction: nothing to read, nothing to keep.
    named: bool


@dataclass(slots=True)  # built per call: not frozen, whose __init__ costs 5x; never mutated
class Evaluation:
    """A store's answer to a check."""

    results: list[OpResult] = field(default_factory=list)
    replayed: bool = False  # answered from the call's record; nothing consumed
    conflict: bool = False  # the call_id belongs to another call (user, tool, cost, ...)
    settled: bool = False  # the call_id's call already finished: it is not run again


@dataclass(frozen=True, slots=True)
class Hold:
    """What an allowed call's settle reaches: a reservation, a slot, or (a loop hold, of
    a rate kind) the counter of a loop rule keyed on results."""

    kind: Kind
    key: str
    # Reserved micro-units (budget); 0 for a slot or a loop hold. A token rate's: the
    # tokens its settle adds (filled in at settle time from the call's usage).
    estimate: int
    rule: str
    # Filled in at settle time from the rule in force: a budget's period (start, end,
    # next period's end); a loop hold's limit, window (ms) and burst; a token rate's
    # limit, window (ms) and 0. Zeros: its rule is gone (a budget keeps the counter's
    # period; a loop hold changes nothing; a token rate adds nothing).
    period: tuple[int, int, int] = (0, 0, 0)

    @property
    def loop(self) -> bool:
        """A loop rule's counter, compared with the call's result at its settle."""
        return self.kind in RATE_KINDS


@dataclass(frozen=True, slots=True)
class Recorded:
    """A recorded call as its settle reads it: what it holds, and its fingerprint, which
    says whose call it is (only a credential that could have checked it settles it) and
    makes the settle apply to that very record."""

    holds: list[Hold]
    fingerprint: str


def blocks(ops: list[CounterOp], admitted: list[bool]) -> bool:
    """All or nothing: the call is blocked when any enforcing op does not admit it."""
    return any(op.role is Role.ENFORCE and not ok for op, ok in zip(ops, admitted, strict=True))


def to_result(
    op: CounterOp, admitted: bool, used: int, retry_ms: int, reset_ms: int, reserved: int
) -> OpResult:
    """Build a result from raw numbers (as the Lua script returns them; -1 = no retry)."""
    remaining = max(0, op.capacity - used - reserved)
    return OpResult(
        admitted, used, remaining, None if retry_ms < 0 else retry_ms, reset_ms, reserved
    )


def _hold_line(kind: Kind, estimate: int, rule: str, key: str) -> str:
    return f"{_CODE[kind]}\t{estimate}\t{rule}\t{key}"


_CODE = {kind: kind.value for kind in Kind}  # an enum's .value costs a descriptor call


def decode_holds(text: str) -> list[Hold]:
    holds = []
    for line in filter(None, text.split("\n")):
        kind, estimate, rule, key = line.split("\t", 3)
        holds.append(Hold(Kind(kind), key, int(estimate), rule))
    return holds
