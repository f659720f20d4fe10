"""The fleet: every worker of every daemon on one store, kept in step and seen whole.

The home of what the processes sharing a store tell each other. Each process polls the
store once a second (`Fleet.poll`), one script, one round trip (`Store.beat`):

- it writes its report (service/console.py `ProcessReport`: its daemon, pid, policy,
  last reload and decision counts), kept `REPORT_TTL_MS`, so a process that stops
  polling drops out of the fleet's view a few seconds after;
- it reads the runtime overrides' version (service/overrides.py reads them all when it
  moved) and the count of each change announced: `reset` and `reload`.

A process that takes a reset or a reload (any trigger) announces it (`Fleet.announce`);
every other process sees the count move at its next poll and follows: on a reset it
forgets its remembered refusals (engine/refusals.py), on a reload it reloads its own
policy source. So a change reaches every process within a poll plus a compile, as the
overrides do. What a process keeps to itself: its refusal cache, its compiled policy,
its Prometheus metrics; what is shared: the counters, the overrides, the change counts,
the reports and the denial list.

The poll is housekeeping on the bare store, each operation within `timeout_s`: kept out
of the decisions' store metrics and circuit breaker, and nothing of it is on the
decision path.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from ratewarden.engine import Engine
from ratewarden.service.overrides import POLL_S, RuntimeOverrides
from ratewarden.service.reload import FLEET_TRIGGER, PolicyReloader
from ratewarden.service.stopping import Stopping
from ratewarden.store.base import FleetState, Store, StoreError

__all__ = ["RELOAD", "REPORT_TTL_MS", "RESET", "Fleet", "daemon_name"]
log = logging.getLogger("ratewarden.fleet")
T = TypeVar("T")

RESET, RELOAD = "reset", "reload"  # the changes every process follows
# A report outlives a few missed polls (a busy process, a slow store), not a dead process.
REPORT_TTL_MS = 5_000


def daemon_name(port: int) -> str:
    """A daemon: the host it runs on and its port (its workers share both)."""
    return f"{socket.gethostname()}:{port}"


class Fleet:
    """This process's part in the fleet: its poll, what it announces, what it reads."""

    def __init__(
        self,
        store: Store,
        engine: Engine,
        reloader: PolicyReloader,
        overrides: RuntimeOverrides,
        report: Callable[[], str],
        daemon: str,
        timeout_s: float = 1.0,
    ) -> None:
        """`report`: this process's report, a JSON document; `daemon`: its daemon's name."""
        self.store, self.timeout_s = store, timeout_s
        self.engine, self.reloader, self.overrides = engine, reloader, overrides
        self.report, self.daemon = report, daemon
        self.member = f"{daemon}/{os.getpid()}"  # this process in the fleet
        self.seen: dict[str, int] | None = None  # the change counts followed (None: no poll yet)
        # A poll's read of the counts and an announce's count of its own change, one at a
        # time: a poll that read our own change before we noted it would follow it.
        self._counting = asyncio.Lock()
        self._poller: asyncio.Task[None] | None = None
        self._stopping = Stopping()

    # -- the poll -----------------------------------------------------------------------

    async def poll(self) -> None:
        """Report, then follow what changed: the overrides, a reset, a reload."""
        async with self._counting:
            state = await self._within(self.store.beat(self.member, self.report(), REPORT_TTL_MS))
            moved = self._moved(state.changes)
        await self.follow(state, moved)

    async def follow(self, state: FleetState, moved: set[str]) -> None:
        if RESET in moved:
            self.engine.refusals.clear()  # a refusal remembered before the reset
            log.info("a reset through another process: remembered refusals forgotten")
        if RELOAD in moved:
            await self.reloader.reload(FLEET_TRIGGER)
        await self.overrides.refresh(state.overrides_version)

    def _moved(self, changes: Mapping[str, int]) -> set[str]:
        """The changes announced since the last poll. The first poll only takes note: a
        process just started has nothing remembered and its policy fresh. A count that went
        down (a store that lost its data) is followed too: forgetting is always safe."""
        seen, self.seen = self.seen, dict(changes)
        if seen is None:
            return set()
        return {change for change, count in changes.items() if seen.get(change, 0) != count}

    async def announce(self, change: str) -> None:
        """Tell every process of a change taken here. Best effort: the change is made,
        and a store that cannot count it leaves the peers' refusals to their own wait."""
        async with self._counting:
            try:
                count = await self._within(self.store.announce(change))
            except StoreError as exc:
                log.warning("%s not announced to the other processes: %s", change, exc)
                return
            # Ours is followed already; another's, announced since our last poll, is not.
            if self.seen is not None and self.seen.get(change, 0) == count - 1:
                self.seen[change] = count

    async def announce_reset(self) -> None:
        await self.announce(RESET)

    async def announce_reload(self) -> None:
        await self.announce(RELOAD)

    async def reports(self) -> dict[str, str]:
        """The live processes' reports, by member (StoreError if the store cannot say)."""
        return await self._within(self.store.reports())

    # -- life cycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Apply the store's overrides now (if it answers), then poll every second."""
        try:
            await self.poll()
        except StoreError as exc:  # the poller reads them once the store answers
            log.warning("fleet not polled at start-up: %s", exc)
        self._poller = asyncio.create_task(self._poll(), name="ratewarden-fleet")

    async def stop(self) -> None:
        """Let the poller finish the round it is in (each store operation has its
        deadline) rather than cancel it mid-command: a store client cancelled halfway
        leaves its connection half-read, never closed."""
        if self._poller is not None:
            self._stopping.set()
            try:
                await asyncio.wait_for(self._poller, 2 * self.timeout_s + 1)
            except TimeoutError:  # wait_for has cancelled it: it is gone either way
                log.warning("fleet poller cancelled at shutdown")
            self._poller = None

    async def _poll(self) -> None:
        while not self._stopping.is_set():
            await self._stopping.nap(POLL_S)
            if self._stopping.is_set():
                return
            try:
                await self.poll()
            except StoreError as exc:  # the store is down: keep what is applied
                log.debug("fleet not polled: %s", exc)
            except Exception:  # the poller must outlive any surprise
                log.exception("fleet poll: unexpected error; still polling")

    async def _within(self, operation: Awaitable[T]) -> T:
        try:
            async with asyncio.timeout(self.timeout_s):
                return await operation
        except TimeoutError:
            raise StoreError(f"no answer in {self.timeout_s:g} s") from None
