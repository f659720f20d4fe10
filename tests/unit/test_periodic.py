"""service/periodic.Periodic: work on a timer that survives its own errors and stops."""

from __future__ import annotations

import asyncio

import pytest

from ratewarden.service.periodic import Periodic


async def test_work_runs_each_tick_survives_an_error_and_stops(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ran: list[int] = []

    def work() -> None:
        ran.append(len(ran))
        if len(ran) == 2:
            raise RuntimeError("a surprise")

    ticks = Periodic("test-ticks", 0.01, work)
    ticks.start()
    while len(ran) < 4:
        await asyncio.sleep(0.01)
    await ticks.stop()
    stopped_at = len(ran)
    await asyncio.sleep(0.05)
    assert len(ran) == stopped_at  # nothing after stop
    assert "test-ticks: unexpected error; still running" in caplog.text
    await ticks.stop()  # twice is harmless
