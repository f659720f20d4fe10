"""Failing open, bounded: the counts a process keeps of its own while the store is down.

While the store cannot answer, a rule that fails open is still counted: its ops are
evaluated here, by the same algorithms (`limiter.reference`, the Lua script's twin), under
the same keys, atomically. So each process admits at most a rule's limit per window for
each counter (its slots, its budget per period), and a fleet of N processes at most N
times that, instead of every call. The real store's counters stay the truth: these are
consulted only while it fails, and kept until they expire, so a store that flaps does not
hand out a fresh limit each time it goes down.
"""

from __future__ import annotations

from collections.abc import Sequence

from ratewarden.clock import Clock
from ratewarden.limiter import reference
from ratewarden.limiter.ops import CallRecord, CounterOp, Evaluation
from ratewarden.store.memory import MemoryStore

# At most this many keys (counters and the records of calls holding a slot or money):
# about 50 MB at worst (measured: 42 MB of sliding-window counters, 50 MB of budgets
# with their calls' records), whatever a flood of distinct users in a long outage sends.
LOCAL_KEYS = 50_000


class LocalCounts(MemoryStore):
    """A memory store that never grows past `cap` keys.

    A decision that would add keys to a full table is not run: the caller refuses it. A
    counter is never evicted early, since forgetting one would admit past the bound.
    """

    def __init__(self, clock: Clock, cap: int = LOCAL_KEYS) -> None:
        if cap < 1:
            raise ValueError(f"local_keys must be at least 1, not {cap}")
        super().__init__(clock)
        self.cap = cap
        self.used = False  # counted something: settles of calls the store lacks look here

    def decide(self, ops: Sequence[CounterOp], record: CallRecord | None) -> Evaluation | None:
        """Decide `ops` as the store would (synchronously: nothing here waits); None if
        the table has no room for the keys they would add."""
        with self._lock:
            now = self.clock.now_ms()
            cells = self._cells
            cells.sweep(now)
            keys = [op.key for op in ops] + ([record.key] if record is not None else [])
            added = sum(1 for key in set(keys) if cells.get(key, now) is None)
            if added and len(cells.values) + added > self.cap:
                return None
            self.used = True
            return reference.decide(cells, list(ops), record, now, dry_run=False)

    def knows(self, record_key: str) -> bool:
        """Whether a call decided here is recorded (so its settle belongs here)."""
        if not self.used:
            return False
        with self._lock:
            return self._cells.get(record_key, self.clock.now_ms()) is not None
