"""The one interface every store implements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ratewarden.limiter.ops import CallRecord, CounterOp, Evaluation, Hold


class StoreError(Exception):
    """The store could not answer (unreachable, timed out, or refused the command)."""


class Store(Protocol):
    """Keeps the counters; decides a call's ops atomically: all are committed, or none."""

    @property
    def description(self) -> str:
        """Where the store is, without credentials; printed at start-up."""
        ...

    async def start(self) -> None:
        """Connect and prepare (load scripts); called once before the first call."""
        ...

    async def evaluate(
        self, ops: Sequence[CounterOp], record: CallRecord | None = None, dry_run: bool = False
    ) -> Evaluation:
        """Decide `ops` together and record the call if allowed; `dry_run` only reports."""
        ...

    async def read_holds(self, record_key: str) -> list[Hold] | None:
        """What a recorded call holds (reservations, slots); None if no such record."""
        ...

    async def settle(
        self, record_key: str, call_id: str, actual: int | None, holds: Sequence[Hold]
    ) -> tuple[int, list[int]]:
        """Settle once: (0 settled | 1 already settled | 2 unknown, charge per hold)."""
        ...

    async def reset(self, pattern: str) -> int:
        """Delete every key matching the glob `pattern`; return how many."""
        ...

    async def push_denials(self, entries: Sequence[str], keep: int) -> None:
        """Prepend audit entries (JSON lines, oldest first) to the recent list; keep `keep`."""
        ...

    async def recent_denials(self, count: int) -> list[str]:
        """The newest `count` audit entries, newest first."""
        ...

    async def ping(self) -> None:
        """Raise StoreError unless the store answers."""
        ...

    async def close(self) -> None: ...
