"""The embedded store: pure Python, one process, the same semantics as Redis.

It runs `engine.reference`, the twin of the Lua script, on an injected clock. Expired
cells are swept lazily, a slice at a time, so memory stays bounded by live counters.
"""

from __future__ import annotations

import collections
import fnmatch
import itertools
import threading
from collections.abc import Sequence
from typing import Any

from ratewarden.clock import Clock, SystemClock
from ratewarden.limiter import reference
from ratewarden.limiter.ops import CallRecord, CounterOp, Evaluation, Hold

# Sweep expired cells at most this often (ms of clock time).
_SWEEP_EVERY_MS = 1_000


class _Cells:
    """Values with an expiry time, like Redis string keys."""

    def __init__(self) -> None:
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

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or SystemClock()
        self._cells = _Cells()
        self._lock = threading.Lock()  # atomicity if used from several threads
        self._denials: collections.deque[str] = collections.deque()

    @property
    def description(self) -> str:
        return "memory:// (embedded, this process only)"

    async def start(self) -> None:
        return None

    async def evaluate(
        self, ops: Sequence[CounterOp], record: CallRecord | None = None, dry_run: bool = False
    ) -> Evaluation:
        with self._lock:
            now = self.clock.now_ms()
            self._cells.sweep(now)
            return reference.decide(self._cells, list(ops), record, now, dry_run)

    async def read_holds(self, record_key: str) -> list[Hold] | None:
        with self._lock:
            return reference.read_holds(self._cells, record_key, self.clock.now_ms())

    async def settle(
        self, record_key: str, call_id: str, actual: int | None, holds: Sequence[Hold]
    ) -> tuple[int, list[int]]:
        with self._lock:
            now = self.clock.now_ms()
            return reference.settle(self._cells, record_key, call_id, actual, list(holds), now)

    async def reset(self, pattern: str) -> int:
        with self._lock:
            doomed = [key for key in self._cells.values if fnmatch.fnmatchcase(key, pattern)]
            for key in doomed:
                del self._cells.values[key]
            return len(doomed)

    async def push_denials(self, entries: Sequence[str], keep: int) -> None:
        with self._lock:
            self._denials.extendleft(entries)
            while len(self._denials) > keep:
                self._denials.pop()

    async def recent_denials(self, count: int) -> list[str]:
        with self._lock:
            return list(itertools.islice(self._denials, count))

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def key_count(self) -> int:
        """Live keys, after dropping expired ones (for tests and the memory benchmark)."""
        with self._lock:
            now = self.clock.now_ms()
            return sum(
                1 for key in list(self._cells.values) if self._cells.get(key, now) is not None
            )
