"""The store's interface, in three narrow parts, and the one way to wrap a store.

- `Counters`: the atomic decisions on counters, what the engine needs;
- `DenialLog`: the recent-denials list, what the audit trail needs;
- `OverrideLog`: runtime overrides, what every daemon applies;
- `FleetLog`: what every process announces and reports (service/fleet.py);
- `ActivityLog`: who is refused, counted in bounded sketches per minute and hour, and
  each user's own recent refusals (service/activity.py);
- `SpendLog`: the budgets' spend per day, what the spend report reads;
- `BudgetSweep`: the budget counters walked in the background (service/sweep.py);
- `NoticeLog`: what the notifier's daemons agree on (service/notify.py): once-only
  claims, and refusals counted across the fleet;
- `Store`: both, with the store's life cycle and its clock.

A `Layer` is a store around a store; each operation passes through its `around`, so a
wrapper (the deadline and breaker in breaker.py, the timer in metrics.py) states what it
adds once, not the interface again. `around` gets the inner operation and its arguments,
not a closure over them: every decision passes two layers, and a closure each was made
and called for nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar, TypeVarTuple

from ratewarden.clock import Clock
from ratewarden.errors import RatewardenError
from ratewarden.limiter.ops import CallRecord, CounterOp, Evaluation, Hold, Recorded
from ratewarden.limiter.script import SettleStatus

T = TypeVar("T")
Args = TypeVarTuple("Args")


class StoreError(RatewardenError):
    """The store could not answer (unreachable, timed out, or refused the command)."""


class Counters(Protocol):
    """Keeps the counters; decides a call's ops atomically: all are committed, or none."""

    async def evaluate(
        self, ops: Sequence[CounterOp], record: CallRecord | None = None, dry_run: bool = False
    ) -> Evaluation:
        """Decide `ops` together and record the call if allowed; `dry_run` only reports."""
        ...

    async def read_holds(self, record_key: str) -> Recorded | None:
        """What a recorded call holds (reservations, slots), and its fingerprint; None if
        no such record."""
        ...

    async def settle(
        self,
        record_key: str,
        call_id: str,
        actual: int | None,
        holds: Sequence[Hold],
        fingerprint: str = "",
        result_digest: str | None = None,
        model: bool = False,
    ) -> tuple[SettleStatus, list[int]]:
        """Settle once: its status, and what each hold charged. With a `fingerprint`, only
        a record of that fingerprint is settled (else UNKNOWN), in the same atomic step.
        `result_digest` is compared with what loop holds kept (None: nothing changes).
        A `model` call's settle also adds what it moved on each budget to the day's
        model spend record (store/keys.py, "Spend records")."""
        ...

    async def reset(self, pattern: str) -> int:
        """Delete every key matching the glob `pattern`; return how many."""
        ...


class DenialLog(Protocol):
    """The newest refusals, shared by every daemon on the store."""

    async def push_denials(self, entries: Sequence[str], keep: int) -> None:
        """Prepend audit entries (JSON lines, oldest first) to the recent list; keep `keep`."""
        ...

    async def recent_denials(self, count: int) -> list[str]:
        """The newest `count` audit entries, newest first."""
        ...


class OverrideLog(Protocol):
    """Runtime overrides, shared by every daemon on the store: documents by id, and a
    version that every change raises (what the daemons poll, once a second)."""

    async def overrides_version(self) -> int:
        """The version now (0: never changed)."""

    async def read_overrides(
        self, known: Collection[str] = ()
    ) -> tuple[int, dict[str, str | None]]:
        """The version and every override, read together: its document, or None for the
        ids in `known` (the reader has them: an id is never given to another override, so
        a change moves only the documents it adds)."""

    async def put_override(
        self, override_id: str, document: str, cap: int, drop: Sequence[str] = ()
    ) -> int | None:
        """Remove the overrides `drop` (expired ones), then store (or replace) one, unless
        `cap` others are stored already: both in one atomic step, so that daemons racing
        to add cannot pass the cap together. The new version, or None when full."""

    async def remove_override(self, override_id: str) -> int | None:
        """Remove one override; the new version, or None if there was no such one."""


@dataclass(frozen=True, slots=True)
class FleetState:
    """What a process's poll reads: the overrides version, and how many of each change
    (`reset`, `reload`) were announced since the store began."""

    overrides_version: int
    changes: Mapping[str, int]


class FleetLog(Protocol):
    """What the processes on the store tell each other: changes they took that each of
    them must follow, and a report of each, kept while it keeps polling."""

    async def beat(self, member: str, report: str, ttl_ms: int) -> FleetState:
        """Keep `member`'s report for `ttl_ms` (replacing its last), remove the reports
        whose time ran out, and read the overrides version and the change counts: one
        atomic step, one round trip (each process's once-a-second poll)."""

    async def announce(self, change: str) -> int:
        """Count one more `change`; its new count."""

    async def reports(self) -> dict[str, str]:
        """The reports of the members whose time has not run out, by member."""


@dataclass(frozen=True, slots=True)
class SketchCounts:
    """What one flush adds to the sketches of one time bucket: by sketch, each member's
    count to add. Members are JSON strings (store/keys.py)."""

    bucket: str
    ttl_ms: int
    counts: Mapping[str, Mapping[str, int]]


class ActivityLog(Protocol):
    """Who is refused, shared by every daemon on the store: per time bucket, sorted sets
    of counts trimmed to their top (a bounded sketch); and each user's newest refusals,
    for a bounded number of users. Written by background flushes, read by the console."""

    async def add_to_sketches(self, adds: Sequence[SketchCounts], keep: int) -> None:
        """Add each bucket's counts, trim each sketch to its `keep` highest members, and
        keep each bucket its TTL."""

    async def read_sketches(self, buckets: Sequence[str], sketch: str) -> list[dict[str, int]]:
        """One sketch of each bucket, whole (empty if none), in the buckets' order."""

    async def sketch_scores(self, buckets: Sequence[str], sketch: str, member: str) -> list[int]:
        """One member's count in one sketch of each bucket (0 if absent), in order."""

    async def push_user_denials(
        self, entries: Sequence[tuple[str, str]], now_ms: int, caps: UserDenialCaps
    ) -> None:
        """Prepend each (user, audit entry), oldest first, to that user's own list; keep
        `caps.keep` per user, the `caps.users` most recently refused users, each list
        `caps.ttl_ms` after its last entry."""

    async def user_denials(self, user: str, count: int) -> list[str]:
        """A user's newest `count` audit entries, newest first."""


@dataclass(frozen=True, slots=True)
class UserDenialCaps:
    keep: int  # entries per user
    users: int  # users kept
    ttl_ms: int  # a list's life after its last entry


class SpendLog(Protocol):
    """What each budget counter charged per UTC day (written by the counters script,
    `spend_key` in keys.py), kept for the store's spend retention."""

    async def spend_records(self, pattern: str, cap: int) -> list[tuple[str, int]]:
        """The day records whose keys match the glob `pattern`, each with its amount
        (micro-units, may be negative: a late settle's refund); at most `cap` of them."""
        ...


class BudgetSweep(Protocol):
    """What the budget sweep (service/sweep.py) needs: one process at a time walks the
    budget counters and charges the reservations that expired unsettled."""

    async def claim_sweep(self, member: str, ttl_ms: int) -> bool:
        """Take the sweep for `ttl_ms` unless another member holds it (SET NX PX), or
        renew it for `ttl_ms` if `member` holds it. True if `member` holds it now."""
        ...

    async def budget_counters(self, count: int) -> tuple[list[tuple[str, int | None]], bool]:
        """The next `count` budget counters (at most) of this process's walk of them, each
        with its earliest reservation expiry (ms; None: nothing reserved), and whether the
        walk ended (the next call starts another)."""
        ...

    async def sweep_budget(self, key: str, period: tuple[int, int, int]) -> int:
        """Charge the counter's reservations that expired unsettled at their estimate, as
        a check of its scope would (`period`: its rule's, zeros if gone). What it charged."""
        ...


class NoticeLog(Protocol):
    """What the daemons' notifiers (service/notify.py) share, so that a fleet sends each
    notification once: never asked on a decision's path, only by the notifier's worker."""

    async def claim(self, key: str, ttl_ms: int) -> bool:
        """Take `key` for `ttl_ms` unless it is taken: True for the one caller that took
        it (Redis `SET NX PX`)."""

    async def tally(self, counts: Sequence[tuple[str, int, int]]) -> list[int]:
        """Add each (key, count, ttl_ms)'s count to its key, whose expiry is set to its
        ttl_ms from now; the new totals, in order, in one round trip."""


class Store(
    Counters,
    DenialLog,
    OverrideLog,
    FleetLog,
    SpendLog,
    ActivityLog,
    BudgetSweep,
    NoticeLog,
    Protocol,
):
    """A store: counters and the denial log, with a life cycle and a clock."""

    @property
    def description(self) -> str:
        """Where the store is, without credentials; printed at start-up."""
        ...

    @property
    def clock(self) -> Clock:
        """The clock that picks budget periods: the memory store's own, a Redis store's
        injected one, else the system's (Redis `TIME` is the time inside the script)."""
        ...

    async def start(self) -> None:
        """Connect and prepare (load scripts); called once before the first call."""
        ...

    async def ping(self) -> None:
        """Raise StoreError unless the store answers."""
        ...

    async def close(self) -> None: ...


class Layer:
    """A store around `inner`: every operation but `close` passes through `around`."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner

    async def around(
        self, operation: str, function: Callable[[*Args], Awaitable[T]], *args: *Args
    ) -> T:
        """Run one operation (`function(*args)` makes its coroutine); a layer adds its part
        here."""
        return await function(*args)

    @property
    def description(self) -> str:
        return self.inner.description

    @property
    def clock(self) -> Clock:
        return self.inner.clock

    async def start(self) -> None:
        await self.around("start", self.inner.start)

    async def evaluate(
        self, ops: Sequence[CounterOp], record: CallRecord | None = None, dry_run: bool = False
    ) -> Evaluation:
        return await self.around("evaluate", self.inner.evaluate, ops, record, dry_run)

    async def read_holds(self, record_key: str) -> Recorded | None:
        return await self.around("read_holds", self.inner.read_holds, record_key)

    async def settle(
        self,
        record_key: str,
        call_id: str,
        actual: int | None,
        holds: Sequence[Hold],
        fingerprint: str = "",
        result_digest: str | None = None,
        model: bool = False,
    ) -> tuple[SettleStatus, list[int]]:
        return await self.around(
            "settle",
            self.inner.settle,
            record_key,
            call_id,
            actual,
            holds,
            fingerprint,
            result_digest,
            model,
        )

    async def reset(self, pattern: str) -> int:
        return await self.around("reset", self.inner.reset, pattern)

    async def spend_records(self, pattern: str, cap: int) -> list[tuple[str, int]]:
        return await self.around("spend_records", self.inner.spend_records, pattern, cap)

    async def claim_sweep(self, member: str, ttl_ms: int) -> bool:
        return await self.around("claim_sweep", self.inner.claim_sweep, member, ttl_ms)

    async def budget_counters(self, count: int) -> tuple[list[tuple[str, int | None]], bool]:
        return await self.around("budget_counters", self.inner.budget_counters, count)

    async def sweep_budget(self, key: str, period: tuple[int, int, int]) -> int:
        return await self.around("sweep_budget", self.inner.sweep_budget, key, period)

    async def push_denials(self, entries: Sequence[str], keep: int) -> None:
        await self.around("push_denials", self.inner.push_denials, entries, keep)

    async def recent_denials(self, count: int) -> list[str]:
        return await self.around("recent_denials", self.inner.recent_denials, count)

    async def overrides_version(self) -> int:
        return await self.around("overrides_version", self.inner.overrides_version)

    async def read_overrides(
        self, known: Collection[str] = ()
    ) -> tuple[int, dict[str, str | None]]:
        return await self.around("read_overrides", self.inner.read_overrides, known)

    async def put_override(
        self, override_id: str, document: str, cap: int, drop: Sequence[str] = ()
    ) -> int | None:
        return await self.around(
            "put_override", self.inner.put_override, override_id, document, cap, drop
        )

    async def remove_override(self, override_id: str) -> int | None:
        return await self.around("remove_override", self.inner.remove_override, override_id)

    async def beat(self, member: str, report: str, ttl_ms: int) -> FleetState:
        return await self.around("beat", self.inner.beat, member, report, ttl_ms)

    async def announce(self, change: str) -> int:
        return await self.around("announce", self.inner.announce, change)

    async def reports(self) -> dict[str, str]:
        return await self.around("reports", self.inner.reports)

    async def add_to_sketches(self, adds: Sequence[SketchCounts], keep: int) -> None:
        await self.around("add_to_sketches", self.inner.add_to_sketches, adds, keep)

    async def read_sketches(self, buckets: Sequence[str], sketch: str) -> list[dict[str, int]]:
        return await self.around("read_sketches", self.inner.read_sketches, buckets, sketch)

    async def sketch_scores(self, buckets: Sequence[str], sketch: str, member: str) -> list[int]:
        return await self.around("sketch_scores", self.inner.sketch_scores, buckets, sketch, member)

    async def push_user_denials(
        self, entries: Sequence[tuple[str, str]], now_ms: int, caps: UserDenialCaps
    ) -> None:
        await self.around("push_user_denials", self.inner.push_user_denials, entries, now_ms, caps)

    async def user_denials(self, user: str, count: int) -> list[str]:
        return await self.around("user_denials", self.inner.user_denials, user, count)

    async def claim(self, key: str, ttl_ms: int) -> bool:
        return await self.around("claim", self.inner.claim, key, ttl_ms)

    async def tally(self, counts: Sequence[tuple[str, int, int]]) -> list[int]:
        return await self.around("tally", self.inner.tally, counts)

    async def ping(self) -> None:
        await self.around("ping", self.inner.ping)

    async def close(self) -> None:
        await self.inner.close()
