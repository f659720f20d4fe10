"""The embedded store: pure Python, one process, the same semantics as Redis.

It runs `engine.reference`, the twin of the Lua script, on an injected clock. Expired
cells are swept lazily, a slice at a time, so memory stays bounded by live counters.

With a state file (`RATEWARDEN_STATE_FILE`), the cells and the recent denials are loaded
at construction, saved every `interval_s` seconds when something changed, and saved once
more by `close()` on a clean shutdown (see `store.snapshot`): a clean restart keeps every
counter and budget, and a crash loses at most the changes of the last interval.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fnmatch
import itertools
import logging
import threading
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from typing import Any

from ratewarden.clock import Clock, SystemClock
from ratewarden.limiter import reference
from ratewarden.limiter.ops import CallRecord, CounterOp, Evaluation, Hold, Recorded
from ratewarden.limiter.script import SPEND_RETENTION_DAYS, SettleStatus
from ratewarden.store import snapshot
from ratewarden.store.base import FleetState, SketchCounts, UserDenialCaps
from ratewarden.store.keys import BUDGET_PATTERN
from ratewarden.store.memory_activity import MemoryActivity
from ratewarden.store.snapshot import StateFile, StateFileError

log = logging.getLogger("ratewarden.store")

# Sweep expired cells at most this often (ms of clock time).
_SWEEP_EVERY_MS = 1_000


class _Cells:
    """Values with an expiry time, like Redis string keys."""

    def __init__(self, spend_retention_days: int) -> None:
        self.spend_retention_days = spend_retention_days
        self.values: dict[str, tuple[Any, int]] = {}
        self._next_sweep = 0

    def get(self, key: str, now_ms: int) -> Any:
        found = self.values.get(key)
        if found is None:
            return None
        value, expires_at = found
        if expires_at <= now_ms:
            del self.values[key]
            return None
        return value

    def put(self, key: str, value: Any, ttl_ms: int, now_ms: int) -> None:
        self.values[key] = (value, now_ms + ttl_ms)

    def delete(self, key: str) -> None:
        self.values.pop(key, None)

    def ttl(self, key: str, now_ms: int) -> int:
        found = self.values.get(key)
        return 0 if found is None else max(0, found[1] - now_ms)

    def sweep(self, now_ms: int) -> None:
        if now_ms < self._next_sweep:
            return
        self._next_sweep = now_ms + _SWEEP_EVERY_MS
        expired = [key for key, (_, expires_at) in self.values.items() if expires_at <= now_ms]
        for key in expired:
            del self.values[key]


class MemoryStore:
    """`memory://`: counters in this process; for one worker, tests and local use."""

    def __init__(
        self,
        clock: Clock | None = None,
        state_file: StateFile | None = None,
        spend_retention_days: int = SPEND_RETENTION_DAYS,
    ) -> None:
        """`state_file`: load it now (StateFileError if it is unusable), then keep it saved.
        `spend_retention_days`: how long a budget's day of spend is kept (0: not at all)."""
        self.clock = clock or SystemClock()
        self._cells = _Cells(spend_retention_days)
        self._lock = threading.Lock()  # atomicity if used from several threads
        self._denials: collections.deque[str] = collections.deque()
        self._overrides: dict[str, str] = {}
        self._overrides_version = 0
        # The fleet: change counts, and each member's report with its expiry (ms). Not in
        # the state file: they describe the processes running now, and this is one.
        self._fleet_changes: dict[str, int] = {}
        self._reports: dict[str, tuple[int, str]] = {}
        self.activity = MemoryActivity(self.clock.now_ms)  # who is refused; not saved either
        self._budget_walk: collections.deque[str] = collections.deque()  # the sweep's
        # The notifier's claims and refusal counts: not in the state file either (a
        # restart may send a notification again, never lose a counter).
        self._notes = _Cells(spend_retention_days=0)  # holds no budget
        self._state = state_file
        self._changes = 0  # bumped by every write; a snapshot is taken only if it moved
        self._saved_changes = 0
        self._saving = asyncio.Lock()
        self._saver: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._closed = False
        if state_file is not None:
            self._load_state(state_file)

    @property
    def description(self) -> str:
        if self._state is None:
            return "memory:// (embedded, this process only)"
        return (
            f"memory:// (embedded, this process only; state file {self._state.path}, "
            f"saved every {self._state.interval_s:g}s)"
        )

    async def start(self) -> None:
        if self._state is not None and self._saver is None and not self._closed:
            self._saver = asyncio.create_task(self._save_periodically(self._state))

    async def evaluate(
        self, ops: Sequence[CounterOp], record: CallRecord | None = None, dry_run: bool = False
    ) -> Evaluation:
        with self._lock:
            now = self.clock.now_ms()
            self._cells.sweep(now)
            if not dry_run:
                self._changes += 1
            return reference.decide(self._cells, list(ops), record, now, dry_run)

    async def read_holds(self, record_key: str) -> Recorded | None:
        with self._lock:
            return reference.read_holds(self._cells, record_key, self.clock.now_ms())

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
        with self._lock:
            now = self.clock.now_ms()
            self._changes += 1
            return reference.settle(
                self._cells,
                record_key,
                call_id,
                actual,
                list(holds),
                now,
                fingerprint,
                result_digest,
                model,
            )

    async def reset(self, pattern: str) -> int:
        with self._lock:
            doomed = [key for key in self._cells.values if fnmatch.fnmatchcase(key, pattern)]
            for key in doomed:
                del self._cells.values[key]
            self._changes += 1
            return len(doomed)

    async def spend_records(self, pattern: str, cap: int) -> list[tuple[str, int]]:
        with self._lock:
            now = self.clock.now_ms()
            found: list[tuple[str, int]] = []
            for key in list(self._cells.values):
                if len(found) >= cap:
                    break
                if fnmatch.fnmatchcase(key, pattern):
                    value = self._cells.get(key, now)
                    if isinstance(value, reference.DaySpend):
                        found.append((key, value.amount))
            return found

    async def claim_sweep(self, member: str, ttl_ms: int) -> bool:
        return True  # one process: nothing to share the sweep with

    async def budget_counters(self, count: int) -> tuple[list[tuple[str, int | None]], bool]:
        """As a SCAN would: the keys present when the walk began, in turn."""
        with self._lock:
            now = self.clock.now_ms()
            if not self._budget_walk:
                pattern = BUDGET_PATTERN
                keys = (k for k in self._cells.values if fnmatch.fnmatchcase(k, pattern))
                self._budget_walk = collections.deque(keys)
            found: list[tuple[str, int | None]] = []
            while self._budget_walk and len(found) < count:
                key = self._budget_walk.popleft()
                state = self._cells.get(key, now)
                if isinstance(state, reference.Budget):
                    expiries = [expiry for _, expiry in state.holds.values()]
                    found.append((key, min(expiries) if expiries else None))
            return found, not self._budget_walk

    async def sweep_budget(self, key: str, period: tuple[int, int, int]) -> int:
        with self._lock:
            now = self.clock.now_ms()
            self._changes += 1
            return reference.sweep(self._cells, key, period, now)

    async def push_denials(self, entries: Sequence[str], keep: int) -> None:
        with self._lock:
            self._changes += 1
            self._denials.extendleft(entries)
            while len(self._denials) > keep:
                self._denials.pop()

    async def recent_denials(self, count: int) -> list[str]:
        with self._lock:
            return list(itertools.islice(self._denials, count))

    async def overrides_version(self) -> int:
        return self._overrides_version

    async def read_overrides(
        self, known: Collection[str] = ()
    ) -> tuple[int, dict[str, str | None]]:
        with self._lock:
            return self._overrides_version, {
                i: None if i in known else document for i, document in self._overrides.items()
            }

    async def put_override(
        self, override_id: str, document: str, cap: int, drop: Sequence[str] = ()
    ) -> int | None:
        with self._lock:  # the count and the write under one lock: the cap holds
            dropped = [self._overrides.pop(i) for i in drop if i in self._overrides]
            if override_id not in self._overrides and len(self._overrides) >= cap:
                if dropped:  # gone all the same: every daemon must read them gone
                    self._bump_overrides()
                return None
            self._overrides[override_id] = document
            return self._bump_overrides()

    async def remove_override(self, override_id: str) -> int | None:
        with self._lock:
            if self._overrides.pop(override_id, None) is None:
                return None
            return self._bump_overrides()

    async def beat(self, member: str, report: str, ttl_ms: int) -> FleetState:
        with self._lock:
            now = self.clock.now_ms()
            self._reports = {m: r for m, r in self._reports.items() if r[0] > now}
            self._reports[member] = (now + ttl_ms, report)
            return FleetState(self._overrides_version, dict(self._fleet_changes))

    async def announce(self, change: str) -> int:
        with self._lock:
            self._fleet_changes[change] = self._fleet_changes.get(change, 0) + 1
            return self._fleet_changes[change]

    async def reports(self) -> dict[str, str]:
        with self._lock:
            now = self.clock.now_ms()
            return {m: report for m, (until, report) in self._reports.items() if until > now}

    async def add_to_sketches(self, adds: Sequence[SketchCounts], keep: int) -> None:
        with self._lock:
            self.activity.add_to_sketches(adds, keep)

    async def read_sketches(self, buckets: Sequence[str], sketch: str) -> list[dict[str, int]]:
        with self._lock:
            return self.activity.read_sketches(buckets, sketch)

    async def sketch_scores(self, buckets: Sequence[str], sketch: str, member: str) -> list[int]:
        with self._lock:
            return self.activity.sketch_scores(buckets, sketch, member)

    async def push_user_denials(
        self, entries: Sequence[tuple[str, str]], now_ms: int, caps: UserDenialCaps
    ) -> None:
        with self._lock:
            self.activity.push_user_denials(entries, now_ms, caps)

    async def user_denials(self, user: str, count: int) -> list[str]:
        with self._lock:
            return self.activity.user_denials(user, count)

    async def claim(self, key: str, ttl_ms: int) -> bool:
        with self._lock:
            now = self.clock.now_ms()
            self._notes.sweep(now)
            if self._notes.get(key, now) is not None:
                return False
            self._notes.put(key, 1, max(1, ttl_ms), now)
            return True

    async def tally(self, counts: Sequence[tuple[str, int, int]]) -> list[int]:
        with self._lock:
            now = self.clock.now_ms()
            self._notes.sweep(now)
            totals = []
            for key, count, ttl_ms in counts:
                total = (self._notes.get(key, now) or 0) + count
                self._notes.put(key, total, max(1, ttl_ms), now)
                totals.append(total)
            return totals

    def _bump_overrides(self) -> int:
        self._changes += 1
        self._overrides_version += 1
        return self._overrides_version

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        """Stop the periodic snapshots and save once more (a clean shutdown loses nothing)."""
        if self._state is None or self._closed:
            return
        self._closed = True
        try:
            if self._saver is not None:
                self._stopping.set()
                await self._saver  # its last round is the final save
                self._saver = None
            else:
                await self._save_logged(self._state)
        finally:
            self._state.release()

    async def save_state(self) -> bool:
        """Write a snapshot now if anything changed since the last one; True if written.

        The cells are copied under the lock (one consistent moment); the JSON encoding and
        the atomic write run in a thread, so checks go on meanwhile.
        """
        state = self._state
        if state is None:
            return False
        async with self._saving:
            with self._lock:
                if self._changes == self._saved_changes:
                    return False
                changes = self._changes
                now = self.clock.now_ms()
                document = snapshot.encode(
                    self._cells.values, self._denials, now, self._saved_overrides()
                )
            await asyncio.to_thread(lambda: state.write(snapshot.dumps(document), changes))
            self._saved_changes = changes
            return True

    async def _save_periodically(self, state: StateFile) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), state.interval_s)
            await self._save_logged(state)

    async def _save_logged(self, state: StateFile) -> None:
        try:
            await self.save_state()
        except StateFileError as exc:  # keep serving; try again next interval
            log.error("%s", exc)
        except Exception:  # a bug must not stop the snapshots for good
            log.exception("cannot save the state file %s", state.path)

    def _load_state(self, state: StateFile) -> None:
        state.acquire()
        try:
            now = self.clock.now_ms()
            loaded = state.load(now)
            if loaded is None:
                log.info("state file %s: none yet, starting from zero", state.path)
            else:
                self._cells.values = loaded.cells
                self._denials.extend(loaded.denials)
                self._overrides_version, self._overrides = loaded.overrides
                saved = datetime.fromtimestamp(loaded.saved_at_ms / 1000, UTC)
                log.info(
                    "state file %s: loaded %d keys saved at %s (%d expired since)",
                    state.path,
                    len(loaded.cells),
                    saved.isoformat(timespec="seconds"),
                    loaded.dropped,
                )
            # Write at once: proves the file can be written before any call is counted.
            document = snapshot.encode(
                self._cells.values, self._denials, now, self._saved_overrides()
            )
            state.write(snapshot.dumps(document))
        except BaseException:
            state.release()
            raise

    def _saved_overrides(self) -> tuple[int, dict[str, str]]:
        return self._overrides_version, dict(self._overrides)

    def key_count(self) -> int:
        """Live keys, after dropping expired ones (for tests and the memory benchmark)."""
        with self._lock:
            now = self.clock.now_ms()
            return sum(
                1 for key in list(self._cells.values) if self._cells.get(key, now) is not None
            )
