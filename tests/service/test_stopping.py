"""service/stopping.py: the stop flag the audit flusher and the fleet poller sleep on."""

from __future__ import annotations

import asyncio
import time

import pytest

from ratewarden.service.stopping import Stopping


async def test_a_nap_lasts_its_seconds_when_nothing_stops_it() -> None:
    stopping = Stopping()
    started = time.monotonic()
    await stopping.nap(0.05)
    assert time.monotonic() - started >= 0.04
    assert not stopping.is_set()


async def test_set_ends_the_nap_under_way_at_once() -> None:
    stopping = Stopping()
    napping = asyncio.create_task(stopping.nap(60))
    await asyncio.sleep(0)  # the nap has begun
    started = time.monotonic()
    stopping.set()
    await asyncio.wait_for(napping, 1)
    assert time.monotonic() - started < 0.5
    assert stopping.is_set()


async def test_once_set_every_nap_returns_at_once() -> None:
    stopping = Stopping()
    stopping.set()
    stopping.set()  # twice is the same
    await asyncio.wait_for(stopping.nap(60), 0.5)


async def test_a_cancelled_nap_raises_and_a_later_set_is_harmless() -> None:
    stopping = Stopping()
    napping = asyncio.create_task(stopping.nap(60))
    await asyncio.sleep(0)
    napping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await napping
    stopping.set()  # no nap under way: nothing to wake
    assert stopping.is_set()


async def test_a_nap_leaves_no_timer_behind() -> None:
    """Ended early, its timer is cancelled: the loop holds nothing of it."""
    stopping = Stopping()
    loop = asyncio.get_running_loop()
    napping = asyncio.create_task(stopping.nap(60))
    await asyncio.sleep(0)
    stopping.set()
    await napping
    timers = [h for h in getattr(loop, "_scheduled", []) if not h.cancelled()]
    assert all(h.when() < loop.time() + 30 for h in timers)
