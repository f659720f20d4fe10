"""One admitted call on the host side, from the daemon's allow to the host's settle.

Every adapter and the MCP guard hold an allowed call that holds something (a concurrency
slot, budget money) until the tool has run, then settle it: the call id it was checked
under, when it started, and at the end its status and how long it took. `AdmittedCall`
is that record, and `settlement` the one spelling of the settle it ends with:

- the duration is the milliseconds since `start` on a monotonic clock (`perf_counter`),
  never negative; a call that never started (cancelled before it went to the MCP server)
  has none;
- a call that never ran (`CallStatus.BLOCKED`: allowed by ratewarden, stopped by a later
  hook) took no time and costs nothing (`duration_ms=0`, `cost=0`): what it held is
  released and no estimate is charged;
- a host that measures the call itself (Strands, hermes) passes its own duration to
  `settlement`.

What to settle is here; when, and through which guard (a `Guard`, an `AsyncGuard`, the
MCP gateway's pool), is each adapter's own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ratewarden.vocabulary import CallStatus
from ratewarden.wire.bodies import SettleRequest

__all__ = ["AdmittedCall", "settlement"]

Clock = Callable[[], float]  # seconds on a monotonic clock


def settlement(status: str, duration_ms: float | None) -> SettleRequest:
    """The settle of a call that ended with `status` after `duration_ms` (None: unknown)."""
    if status == CallStatus.BLOCKED:  # it never ran: release what it holds, charge nothing
        return SettleRequest(status=status, duration_ms=0.0, cost=0.0)
    duration = None if duration_ms is None else max(duration_ms, 0.0)
    return SettleRequest(status=status, duration_ms=duration)


class AdmittedCall:
    """An allowed call waiting for its tool to finish: its id, its guard (whatever the
    adapter settles through; None when the adapter holds its own) and its start.

    Started when made, unless `started=False` (the MCP guard starts the clock when the
    call goes to the server, not when the daemon allowed it)."""

    __slots__ = ("_clock", "call_id", "guard", "started")

    def __init__(
        self,
        call_id: str,
        guard: Any = None,
        *,
        started: bool = True,
        clock: Clock = time.perf_counter,
    ) -> None:
        self.call_id = call_id
        self.guard = guard
        self._clock = clock
        self.started: float | None = clock() if started else None

    def start(self) -> None:
        """The call begins to run now."""
        self.started = self._clock()

    def elapsed_ms(self) -> float | None:
        """Milliseconds since the call started; None if it never did."""
        return None if self.started is None else (self._clock() - self.started) * 1000

    def settlement(self, status: str) -> SettleRequest:
        """Its settle, ending now with `status`."""
        return settlement(status, self.elapsed_ms())

    def __repr__(self) -> str:
        return f"AdmittedCall({self.call_id!r}, started={self.started!r})"
