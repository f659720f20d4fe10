"""Refusals remembered in the daemon, so a looping agent costs Redis nothing.

An agent that loops on a refused call asks again at once, and again. Each answer would
be a script run in Redis, and the answer cannot change before the counter's
`retry_after`: a rate counter frees a unit only as time passes (nothing else adds one but
a reset). So a rate refusal is remembered, keyed exactly as the counter that refused and
with the limit it refused at, until its wait is over; an attempt within it is answered
here, with the wait left.

Only refusals that waiting alone can lift: an enforcing `deny` rule's rate counter
(sliding window, token bucket, fixed window) that said when it would admit again. Never
a budget or a concurrency slot (a settle frees those), nor a loop rule keyed on results
(a settle that brings a new result restarts its count: the engine never passes its
refusals here), never an `ask` (an approval lets it past), never a shadow rule. The
cache only ever refuses, so it can never admit what Redis would refuse. A reset, a
reload or an override change clears the cache of the process that took it at once, and
every other process's at its next poll (service/fleet.py, about a second). A refusal
asked before a clear and answered after it is not remembered (it may be what the
cleared change lifted), unless both fell in the same millisecond.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from ratewarden.clock import Clock, SystemClock
from ratewarden.limiter.ops import CounterOp, Kind, OpResult, Role

# Counters that only time refills (a token window too: its settles only add).
_RATE_KINDS = frozenset({Kind.SLIDING_WINDOW, Kind.TOKEN_BUCKET, Kind.FIXED_WINDOW, Kind.TOKENS})
# Entries kept at most; a flood of distinct refused keys empties the cache, never grows it.
MAX_ENTRIES = 100_000


@dataclass(frozen=True, slots=True)
class _Refusal:
    until_ms: int  # the counter admits again from here
    shape: tuple[int, int, int]  # limit, window, burst: the same counter at another limit
    result: OpResult  # what Redis said, at `at_ms`
    at_ms: int


class RefusalCache:
    def __init__(self, clock: Clock, max_entries: int = MAX_ENTRIES) -> None:
        # This cache's clock: read before the store is asked, for `remember`'s `asked_at`.
        self.clock = _steady(clock)
        self._max_entries = max_entries
        # Counter key -> refusal. Public so the engine can tell "none" with no call; it
        # is only ever changed in place here.
        self.entries: dict[str, _Refusal] = {}
        self.hits = 0  # attempts answered here (a metric reads it)
        self._cleared_at = -1  # this cache's clock at the last clear

    def __len__(self) -> int:
        return len(self.entries)

    def refusals(self, ops: list[CounterOp], deny: list[bool]) -> list[tuple[int, OpResult]]:
        """The ops still refused, each with its result and the wait that is left; none
        when the call must go to the store. `deny[i]`: op i's rule denies (not asks)."""
        entries = self.entries
        if not entries:
            return []
        now = self.clock()
        found = []
        for i, op in enumerate(ops):
            known = entries.get(op.key)
            if known is None or not deny[i] or op.role is not Role.ENFORCE:
                continue
            if known.until_ms <= now:
                del entries[op.key]
            elif known.shape == (op.limit, op.window_ms, op.burst):  # not another user's
                found.append((i, _aged(known, now)))  # limit on a shared counter
        return found

    def remember(
        self, ops: list[CounterOp], results: list[OpResult], deny: list[bool], asked_at: int
    ) -> None:
        """Keep the refusals among `results` that only waiting can lift. Each wait counts
        from `asked_at`, before the store was asked: the store's own clock read later, so
        an entry never outlasts the refusal it repeats."""
        if not self._max_entries:
            return  # turned off (RATEWARDEN_REMEMBER_REFUSALS=false)
        if asked_at < self._cleared_at:
            return  # asked before a clear: the change it followed may lift this refusal
        for op, result, denies in zip(ops, results, deny, strict=True):
            wait = result.retry_after_ms
            if result.admitted or not denies or wait is None or wait <= 0:
                continue
            if op.role is not Role.ENFORCE or op.kind not in _RATE_KINDS:
                continue
            # Room for each new key: a call refused by several counters adds several.
            if op.key not in self.entries and len(self.entries) >= self._max_entries:
                self._make_room(self.clock())
            shape = (op.limit, op.window_ms, op.burst)
            self.entries[op.key] = _Refusal(asked_at + wait, shape, result, asked_at)

    def clear(self) -> None:
        """Forget every refusal (a reload, a reset, an override changed a limit), and any
        answer to a call asked before now."""
        self.entries.clear()
        self._cleared_at = self.clock()

    def _make_room(self, now: int) -> None:
        live = {k: v for k, v in self.entries.items() if v.until_ms > now}
        self.entries.clear()  # in place: the engine holds no copy, but keep one dict
        if len(live) < self._max_entries:
            self.entries.update(live)


def _aged(found: _Refusal, now: int) -> OpResult:
    """The stored result as it stands now: less to wait, sooner to reset."""
    elapsed = now - found.at_ms
    return replace(
        found.result,
        retry_after_ms=found.until_ms - now,
        reset_after_ms=max(0, found.result.reset_after_ms - elapsed),
    )


def _steady(clock: Clock) -> Callable[[], int]:
    """Milliseconds that never jump: the monotonic clock for the real one (a wall clock
    set back would keep a refusal past its wait), an injected clock as it is."""
    if isinstance(clock, SystemClock):
        return lambda: time.monotonic_ns() // 1_000_000
    return clock.now_ms
