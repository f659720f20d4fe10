"""A background loop's stop flag, which it sleeps on between rounds.

The audit flusher (five times a second) and the fleet poller (once a second) each sleep
until their next round or until they are told to stop, and are then let finish the
round they are in rather than cancelled mid-command (audit.py and fleet.py say why).
`asyncio.wait_for(event.wait(), seconds)` does that, but makes a task, a waiter and, at
every timeout, a cancellation and a wait for it, six times a second, busy or not: a
sixth of the bytecodes an idle daemon ran (docs/benchmarks.md, 2026-11-29).
`nap` is a plain sleep (a future and a timer, what `asyncio.sleep` makes) that `set`
ends early.
"""

from __future__ import annotations

import asyncio


class Stopping:
    """Set once, to stop a loop; `nap(seconds)` sleeps that long, or until it is set."""

    def __init__(self) -> None:
        self._set = False
        self._wake: asyncio.Future[None] | None = None  # the nap under way, if any

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        """Stop: the nap under way (if any) ends now, and every later one at once."""
        self._set = True
        _wake(self._wake)

    async def nap(self, seconds: float) -> None:
        """Sleep `seconds`, or until `set` (at once if it was). A cancel ends it too."""
        if self._set:
            return
        loop = asyncio.get_running_loop()
        self._wake = wake = loop.create_future()
        timer = loop.call_later(seconds, _wake, wake)
        try:
            await wake
        finally:
            timer.cancel()
            self._wake = None


def _wake(nap: asyncio.Future[None] | None) -> None:
    if nap is not None and not nap.done():
        nap.set_result(None)
