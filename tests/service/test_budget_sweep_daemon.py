"""The daemon runs the budget sweep (service/sweep.py) every RATEWARDEN_SWEEP_INTERVAL_S:
a reservation left unsettled shows in `GET /v1/admin/spend` at its estimate with no other
call of its scope; 0 turns the sweep off; a store that fails a tick leaves the loop
running; the setting is refused outside 0 to 300 naming it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import ValidationError

from ratewarden.calls import Call
from ratewarden.clock import FakeClock
from ratewarden.service.settings import Settings
from ratewarden.service.sweep import BudgetSweeper
from ratewarden.store import MemoryStore
from ratewarden.store.base import StoreError
from tests.helpers.app import build_app, serving

POLICY = """\
version: 1
defaults: {timezone: UTC, reservation_ttl: 10m}
rules:
  - {name: daily-spend, per: [user], budget: 5.00/day, currency: USD}
"""
ADMIN = {"Authorization": "Bearer adm"}


async def _spent(http: Any) -> list[tuple[str, float]]:
    answer = (await http.get("/v1/admin/spend?since=1d", headers=ADMIN)).json()
    return [(row["scope"]["user"], row["amount"]) for row in answer["rows"]]


async def _until(what: Any, timeout_s: float = 5.0) -> Any:
    for _ in range(int(timeout_s / 0.02)):
        found = await what()
        if found:
            return found
        await asyncio.sleep(0.02)
    return await what()


async def test_the_daemon_sweeps_an_unsettled_reservation_into_the_history() -> None:
    clock = FakeClock(1_700_000_017_345)
    app = build_app(POLICY, MemoryStore(clock), admin_tokens=["adm"], sweep_interval_s=0.02)
    async with serving(app) as http:
        assert (await app.state.engine.check(Call("alice", "t", "c1", cost=0.75))).allowed
        await asyncio.sleep(0.1)  # sweeps ran: nothing due yet
        assert await _spent(http) == []
        clock.advance(10 * 60_000)  # expired; alice never calls again
        assert await _until(lambda: _spent(http)) == [("alice", 0.75)]
        metrics = (await http.get("/metrics", headers=ADMIN)).text
        assert "\nratewarden_budget_swept_total 1.0\n" in metrics


async def test_an_interval_of_zero_runs_no_sweep() -> None:
    clock = FakeClock(1_700_000_017_345)
    app = build_app(POLICY, MemoryStore(clock), admin_tokens=["adm"], sweep_interval_s=0)
    async with serving(app) as http:
        await app.state.engine.check(Call("alice", "t", "c1", cost=0.75))
        clock.advance(10 * 60_000)
        await asyncio.sleep(0.2)
        assert await _spent(http) == []


class FailingOnce(MemoryStore):
    """A store whose first walk fails, as Redis going away would."""

    failed = False

    async def budget_counters(self, count: int) -> tuple[list[tuple[str, int | None]], bool]:
        if not self.failed:
            self.failed = True
            raise StoreError("ConnectionError: gone")
        return await super().budget_counters(count)


async def test_a_failed_tick_is_logged_and_the_next_one_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock(1_700_000_017_345)
    store = FailingOnce(clock)
    app = build_app(POLICY, store, admin_tokens=["adm"], sweep_interval_s=0.02)
    async with serving(app) as http:
        await app.state.engine.check(Call("alice", "t", "c1", cost=0.75))
        clock.advance(10 * 60_000)
        assert await _until(lambda: _spent(http)) == [("alice", 0.75)]
    assert store.failed
    assert "budget sweep skipped: ConnectionError: gone" in caplog.text


async def test_a_sweeper_stops_between_ticks() -> None:
    clock = FakeClock(1_700_000_017_345)
    app = build_app(POLICY, MemoryStore(clock), sweep_interval_s=300)
    sweeper = BudgetSweeper(MemoryStore(clock), app.state.engine, 300)
    sweeper.start()
    await asyncio.wait_for(sweeper.stop(), 2)  # not after a 300 s nap


@pytest.mark.parametrize("value", ["-1", "301", "nan", "inf", "1e9", "soon", ""])
def test_the_interval_is_refused_outside_its_range_naming_it(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("RATEWARDEN_SWEEP_INTERVAL_S", value)
    with pytest.raises(ValidationError, match="sweep_interval_s"):
        Settings()
