"""A small piece of work the daemon does every few seconds on its event loop, away from
any request (the console's sampler, the HTTP answers' flush into Prometheus)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

log = logging.getLogger("ratewarden")


class Periodic:
    """`work()` every `interval_s` seconds from `start()` until `stop()`; an error is
    logged and the next tick runs: the work must outlive any surprise."""

    def __init__(self, name: str, interval_s: float, work: Callable[[], object]) -> None:
        self.name = name
        self.interval_s = interval_s
        self.work = work
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self.work()
            except Exception:
                log.exception("%s: unexpected error; still running", self.name)
