"""The one place that reads the wall clock.

Everything else takes a `Clock`, so window arithmetic is tested on a fake clock and
never sleeps. Times are integer milliseconds since the Unix epoch, the unit the Lua
script works in.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Return the current time in milliseconds since the epoch."""
        ...


class SystemClock:
    """The wall clock; used by the embedded store (Redis stores read Redis `TIME`)."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class FakeClock:
    """A clock that only moves when told to; for tests and simulations."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms

    def now_ms(self) -> int:
        return self._now

    def advance(self, ms: int) -> None:
        if ms < 0:
            raise ValueError("a clock never goes back")
        self._now += ms

    def set(self, now_ms: int) -> None:
        self._now = now_ms
