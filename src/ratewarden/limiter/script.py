"""The contract between Python and the counters script: its one home.

The script is assembled at import from Lua files split by concern, into one source (one
SHA, one EVALSHA per decision), after one line that sets its spend retention (`source`):
`codec.lua` (the mode, the clock, number codecs), one file per algorithm in
`algorithms/` beside its Python twin of the same name and shape, `decide.lua` and
`settle.lua` (twins in reference.py), `cluster.lua` (no twin) and `modes.lua` (the entry
point). The conformance tests hold each pair to the same answers.

Every mode's KEYS, ARGV and reply, as both sides read them (times are ms since the
epoch, money integer micro-units; `now` is '' for Redis `TIME`):

decide        KEYS: the call's record, then one counter per op.
              ARGV: 'decide', now, dry ('1' = report only), call_id, fingerprint, record
              TTL, named ('1' = the caller chose call_id: read its record for a replay,
              and record the call even without holds), then OP_VALUES per op.
              Reply: a Status, then NUMBERS per op.
settle        KEYS: the call's record, then per hold its counter, and for a loop hold
              the key of the result kept beside it (`result_key`: same hash tag).
              ARGV: 'settle', now, call_id, actual cost ('' = the estimate), result
              digest ('' = none), model ('1' = a model call: what each budget hold
              moves is added to its day's model record too), fingerprint (a record of
              another is UNKNOWN; '' = any), then HOLD_VALUES per hold.
              Reply: a SettleStatus, then per hold what it charged (0 for a loop hold).
claim         KEYS: the record. ARGV: 'claim', now, call_id, fingerprint, nonce, pending TTL.
              Reply: {ALLOWED} claimed (a pending marker holds the call_id), {REPLAYED,
              numbers...}, {CONFLICT}, {IN_FLIGHT} (another check of it) or {SETTLED}.
record        KEYS: the record. ARGV: 'record', now, nonce, fingerprint, numbers
              (comma-separated), holds, TTL, named. Reply: {ALLOWED} written (or, with
              nothing to keep, the claim dropped), {REPLAYED, numbers...} when another
              check recorded the call first, {IN_FLIGHT} while it is pending.
unclaim       KEYS: the record. ARGV: 'unclaim', now, nonce: drop our pending marker (or
              the record we wrote), never another check's. Reply: {ALLOWED}.
group         KEYS: the counters of one slot. ARGV: 'group', now, dry, call_id, then
              OP_VALUES per op. Commits the slot's ops unless one of its enforcing ops
              refuses. Reply: a Status, then GROUP_NUMBERS per op.
release       KEYS: counters of one slot that 'group' committed. ARGV: 'release', now,
              call_id, then OP_VALUES + 2 undo tokens per op. Takes back exactly what that
              commit took. Reply: NUMBERS per op, a fresh look at each counter.
settle_mark   KEYS: the record. ARGV: 'settle_mark', now, fingerprint ('' = any). Reply: a
              SettleStatus (SETTLED when it was open and is now marked; UNKNOWN also
              while pending, or when the record has another fingerprint).
settle_holds  KEYS: the holds of one slot, as for settle (a loop hold's two keys).
              ARGV: 'settle_holds', now, call_id, actual, result digest, model, then
              HOLD_VALUES per hold. Reply: per hold, what it charged.
sweep         KEYS: one budget counter. ARGV: 'sweep', now, its rule's period (3; zeros:
              the rule is gone). When its earliest reservation expiry (`n`) is due, loads
              and saves it as a check would: expired reservations charged at their
              estimate, into the day's spend record. Reply: {what it charged}.

A loop hold (an op of a rate kind with a hold line: a rule with `same_result: true`)
carries its rule's limit, window and burst where a budget's hold carries its period
(zeros: the rule is gone, and the settle leaves the counter alone). Its settle with a
digest compares it with the result kept in `rw:{<rule>|<dims>}:<alg>:r` (a string, the
last 32-hex digest, expiring with the window): a different one empties the counter and
commits this call as its first unit (by the algorithm's own commit); then the digest is
kept (SET ... PX window). Without a digest, nothing changes.

A token rate's op (kind 'tk') takes nothing at its check: it admits while its window
(clock-aligned, "start:count" as a fixed window's) holds fewer tokens than its limit, and
its hold line is listed in the record of every allowed call, whatever its own verdict.
Its hold at settle carries the tokens to add as its estimate and its rule's limit, window
and 0 as its period (zeros: the rule is gone, nothing is added); the settle adds the
tokens to the current window (PX to its end) and reports 0 charged. One key per hold.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from enum import IntEnum, StrEnum
from importlib import resources

from ratewarden.limiter.ops import (
    CallRecord,
    CounterOp,
    Evaluation,
    Hold,
    Kind,
    OpResult,
    Recorded,
    Role,
    decode_holds,
    to_result,
)

_PARTS = (
    "codec.lua",
    "algorithms/sliding_window.lua",
    "algorithms/token_bucket.lua",
    "algorithms/fixed_window.lua",
    "algorithms/token_window.lua",
    "algorithms/budget.lua",
    "algorithms/concurrency.lua",
    "decide.lua",
    "settle.lua",
    "cluster.lua",
    "modes.lua",
)
_HERE = resources.files("ratewarden.limiter")
_BODY = "\n".join(_HERE.joinpath(part).read_text() for part in _PARTS)

# How long a day's spend record lives past its day (RATEWARDEN_SPEND_RETENTION_DAYS; 0:
# keep none). A constant of the script, not an argument: a decision's ARGV stays as it
# was, and a store running with another retention simply loads its own script (SHA).
SPEND_RETENTION_DAYS = 90
MAX_SPEND_RETENTION_DAYS = 3660  # ten years: past this, a typo more likely than a need


def source(spend_retention_days: int = SPEND_RETENTION_DAYS) -> str:
    """The whole script, with its spend retention (days) as its first line."""
    if not 0 <= spend_retention_days <= MAX_SPEND_RETENTION_DAYS:
        raise ValueError(
            f"spend retention must be 0 to {MAX_SPEND_RETENTION_DAYS} days, "
            f"not {spend_retention_days}"
        )
    return f"local SPEND_RETENTION_DAYS = {int(spend_retention_days)}\n{_BODY}"


def sha(script: str) -> str:
    return hashlib.sha1(script.encode()).hexdigest()


SOURCE = source()
SHA = sha(SOURCE)


class ScriptMode(StrEnum):
    """ARGV[1]: which step the script runs (see the module docstring)."""

    DECIDE = "decide"
    SETTLE = "settle"
    CLAIM = "claim"
    RECORD = "record"
    UNCLAIM = "unclaim"
    GROUP = "group"
    RELEASE = "release"
    SETTLE_MARK = "settle_mark"
    SETTLE_HOLDS = "settle_holds"
    SWEEP = "sweep"


class Status(IntEnum):
    """The first number of a decision-side reply (decide, group, claim, record)."""

    ALLOWED = 0  # decided and allowed; claimed; recorded
    BLOCKED = 1  # an enforcing op refused: nothing was committed
    REPLAYED = 2  # answered from the call's record; the numbers follow
    CONFLICT = 3  # the call_id belongs to another call
    IN_FLIGHT = 4  # another check of the call_id is being decided (cluster)
    SETTLED = 5  # the call_id's call already finished


class SettleStatus(IntEnum):
    """The first number of a settle reply (settle, settle_mark)."""

    SETTLED = 0
    ALREADY_SETTLED = 1
    UNKNOWN = 2  # no record (never allowed, expired, or still pending on a cluster)


OP_VALUES = 10  # per op: kind, role, limit, window, burst, cost, period (3), hold line
HOLD_VALUES = 5  # per hold: kind, estimate, period (3; a loop hold: limit, window, burst)
NUMBERS = 5  # per op: admitted (1/0), used, retry (-1: waiting does not help), reset, reserved
GROUP_NUMBERS = 8  # per op from 'group': the five, committed (1/0), two undo tokens


def rule_values(
    kind: Kind, role: Role, limit: int, window_ms: int, burst: int
) -> tuple[str, int, int, int, int]:
    """An op's first five values, which come from its rule (a store may encode them once)."""
    return kind.value, int(role), limit, window_ms, burst


def held_values(cost: int, period: tuple[int, int, int]) -> tuple[int, int, int, int]:
    """An op's next four: a budget's cost and period (zeros for an op that holds nothing)."""
    return cost, *period


def op_values(op: CounterOp) -> list[str | int]:
    """All OP_VALUES of one op, in order."""
    return [
        *rule_values(op.kind, op.role, op.limit, op.window_ms, op.burst),
        *held_values(op.cost, op.period),
        op.hold_line,
    ]


def hold_values(hold: Hold) -> tuple[str, int, int, int, int]:
    return hold.kind.value, hold.estimate, *hold.period


_DECIDE = ScriptMode.DECIDE.value  # read once: an enum member's .value costs 0.4 us a read
_CONFLICT, _SETTLED, _REPLAYED = int(Status.CONFLICT), int(Status.SETTLED), int(Status.REPLAYED)


def decide_head(now: str, dry_run: bool, record: CallRecord | None) -> list[str | int]:
    """ScriptMode.DECIDE's ARGV before the ops."""
    dry = "1" if dry_run else "0"
    if record is None:
        return [_DECIDE, now, dry, "", "", 0, "0"]
    named = "1" if record.named else "0"
    return [_DECIDE, now, dry, record.call_id, record.fingerprint, record.ttl_ms, named]


def settle_head(
    mode: ScriptMode,
    now: str,
    call_id: str,
    actual: int | None,
    digest: str | None,
    model: bool = False,
) -> list[str | int]:
    """ScriptMode.SETTLE's (before the fingerprint) or ScriptMode.SETTLE_HOLDS' ARGV
    before the holds."""
    flag = "1" if model else ""
    return [mode.value, now, call_id, "" if actual is None else actual, digest or "", flag]


def result_key(counter_key: str) -> str:
    """Where a loop rule keyed on results keeps its counter's last result (same slot)."""
    return counter_key + ":r"


def hold_keys(holds: Sequence[Hold]) -> list[str]:
    """The KEYS of `holds` in a settle: each one's counter, and a loop hold's result key."""
    keys = []
    for hold in holds:
        keys.append(hold.key)
        if hold.loop:
            keys.append(result_key(hold.key))
    return keys


RECORD_FIELDS = ("s", "h", "f")  # a record's state, holds and fingerprint, as a settle reads


def recorded(found: Sequence[bytes | str | None]) -> Recorded | None:
    """A record's RECORD_FIELDS as read (HMGET) for its settle; None when there is no
    record, or only a cluster check's pending claim."""
    state, holds, fingerprint = (v.decode() if isinstance(v, bytes) else v for v in found)
    if state is None or state == "pending":
        return None
    return Recorded(decode_holds(holds or ""), fingerprint or "")


def results_from(ops: Sequence[CounterOp], numbers: Sequence[int]) -> list[OpResult]:
    """Results from the raw numbers (NUMBERS per op); none if the ops no longer line up."""
    if len(numbers) != NUMBERS * len(ops):
        return []
    n = iter(numbers)  # zipped five times over: each op takes the next five numbers
    return [
        to_result(op, bool(admitted), used, retry, reset, reserved)
        for op, admitted, used, retry, reset, reserved in zip(ops, n, n, n, n, n, strict=True)
    ]


def evaluation_of(ops: Sequence[CounterOp], reply: Sequence[int]) -> Evaluation:
    """A decision-side reply (decide, or a cluster claim or record that was answered from
    the call's record) as the store's answer."""
    status = reply[0]  # compared as plain ints: on every decision
    if status == _CONFLICT:
        return Evaluation(conflict=True)
    if status == _SETTLED:
        return Evaluation(settled=True)
    return Evaluation(results_from(ops, reply[1:]), replayed=status == _REPLAYED)
