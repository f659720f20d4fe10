"""The budget sweep: reservations that expired unsettled are charged, even in a scope no
call comes back to.

A budget reservation left unsettled is charged at its estimate, to the budget and to the
day's spend record, by the next load of its counter (budget.lua `charge_expired`): a check
or a settle of that scope. Without one before the counter expires, the estimate would never
reach the spend history. So every RATEWARDEN_SWEEP_INTERVAL_S (default 60; 0: off) one
process of the fleet (the one holding `rw:admin:sweep`: SET NX PX, renewed at each of its
ticks for two intervals, so one walk goes on tick after tick) walks on through
the budget counters (SCAN `rw:{*}:bg`, every primary of a cluster; at most `BATCH` per
tick, each read with its earliest reservation expiry) and, for each one due, runs the
script's `sweep` mode: the same `budget_load` and `budget_save` a check runs, with the
period of the rule the key names (zeros if the rule is gone, as a settle passes). A
reservation charged is removed from the counter and marked `x:` (so a late settle corrects
it by the difference): a second sweep, a check or a settle never charges it again.

A counter lives 15 minutes past its latest reservation's expiry (store/keys.py), at least
three ticks at the longest interval, so a walk of up to three ticks' `BATCH` counters finds
each due counter before it expires.

Housekeeping on the bare store, each operation within `timeout_s`, away from the decision
path: a failed tick is logged and the next one runs.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ratewarden.engine import Engine
from ratewarden.service.stopping import Stopping
from ratewarden.store.base import Store, StoreError
from ratewarden.store.keys import counter_rule

log = logging.getLogger("ratewarden.sweep")
T = TypeVar("T")

BATCH = 10_000  # budget counters looked at per tick, at most (a SCAN walk goes on)
MIN_CLAIM_MS = 1_000


class BudgetSweeper:
    """This process's part in the sweep: a tick every `interval_s` seconds."""

    def __init__(
        self,
        store: Store,
        engine: Engine,
        interval_s: float,
        member: str | None = None,
        timeout_s: float = 1.0,
        batch: int = BATCH,
        charged: Callable[[], None] | None = None,
    ) -> None:
        """`charged()`: called for each counter a sweep charged (the metrics count it)."""
        self.store, self.engine, self.charged = store, engine, charged
        self.interval_s, self.timeout_s, self.batch = interval_s, timeout_s, batch
        self.member = member or f"sweep/{os.getpid()}"
        # Renewed at every tick, held two intervals: one process keeps sweeping (and its
        # walk goes on), and another takes over within two intervals when it stops.
        self.claim_ms = max(MIN_CLAIM_MS, int(interval_s * 2000))
        self._task: asyncio.Task[None] | None = None
        self._stopping = Stopping()

    async def tick(self) -> int:
        """One round, if this process takes the claim: what it charged (micro-units)."""
        if not await self._within(self.store.claim_sweep(self.member, self.claim_ms)):
            return 0
        return await self.sweep()

    async def sweep(self) -> int:
        """The next step of the walk, claimed or not (the script charges each reservation
        once, whoever runs it): what it charged (micro-units)."""
        # A walk's step is many SCANs and pipelines: more time than one command.
        counters, _ = await self._within(self.store.budget_counters(self.batch), scale=10)
        now = self.engine.clock.now_ms()  # the script decides on its own clock: a
        charged = 0  # counter this clock thinks not yet due is swept at a later tick
        for key, due in counters:
            if due is None or due > now:
                continue
            period = self.engine.budget_period(counter_rule(key) or "")
            moved = await self._within(self.store.sweep_budget(key, period))
            if moved and self.charged is not None:
                self.charged()
            charged += moved
        if charged:
            log.info("budget sweep: charged %d micro-units of expired reservations", charged)
        return charged

    # -- life cycle ---------------------------------------------------------------------

    def start(self) -> None:
        if self.interval_s > 0:
            self._task = asyncio.create_task(self._run(), name="ratewarden-sweep")

    async def stop(self) -> None:
        """Let the tick under way finish (each store operation has its deadline)."""
        task = self._task
        if task is not None:
            self._stopping.set()
            try:
                await asyncio.wait_for(task, 10 * self.timeout_s + 1)
            except TimeoutError:
                log.warning("budget sweep cancelled at shutdown")
            self._task = None

    async def _run(self) -> None:
        while not self._stopping.is_set():
            await self._stopping.nap(self.interval_s)
            if self._stopping.is_set():
                return
            try:
                await self.tick()
            except StoreError as exc:  # the store is down: the next tick tries again
                log.warning("budget sweep skipped: %s", exc)
            except Exception:  # the sweep must outlive any surprise
                log.exception("budget sweep: unexpected error; still running")

    async def _within(self, operation: Awaitable[T], scale: int = 1) -> T:
        try:
            async with asyncio.timeout(scale * self.timeout_s):
                return await operation
        except TimeoutError:
            raise StoreError(f"no answer in {scale * self.timeout_s:g} s") from None
