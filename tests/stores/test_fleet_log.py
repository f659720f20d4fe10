"""The store's fleet operations (store/base.py `FleetLog`), the same on every store: a
beat keeps a process's report and reads the overrides version and the change counts in
one step; an announce counts a change; a report whose time ran out is gone."""

from __future__ import annotations

import asyncio

from ratewarden.clock import FakeClock
from ratewarden.store import Store
from ratewarden.store.base import FleetState, Layer


async def test_a_beat_reads_the_overrides_version_and_every_change_count(store: Store) -> None:
    assert await store.beat("host:1/10", "{}", 10_000) == FleetState(0, {})
    assert [await store.announce("reset") for _ in range(2)] == [1, 2]
    assert await store.announce("reload") == 1
    assert await store.put_override("ovr_1", "{}", 10) == 1
    state = await store.beat("host:1/10", "{}", 10_000)
    assert (state.overrides_version, dict(state.changes)) == (1, {"reset": 2, "reload": 1})


async def test_reports_are_kept_replaced_and_dropped_when_their_time_runs_out(
    store: Store, clock: FakeClock
) -> None:
    await store.beat("host:1/10", '{"n": 1}', 10_000)
    await store.beat("host:2/20", '{"n": 2}', 200)
    assert await store.reports() == {"host:1/10": '{"n": 1}', "host:2/20": '{"n": 2}'}
    await store.beat("host:1/10", '{"n": 3}', 10_000)  # its newest report replaces the last
    clock.advance(400)  # the memory store's clock; a real Redis's TIME moves by itself:
    await asyncio.sleep(0.4)  # a real pause, past the 200 ms the second was given
    assert await store.reports() == {"host:1/10": '{"n": 3}'}
    await store.beat("host:1/10", '{"n": 4}', 10_000)  # and a beat removes the expired one
    assert await store.reports() == {"host:1/10": '{"n": 4}'}


async def test_a_layer_passes_the_fleet_operations_through(store: Store) -> None:
    layered = Layer(store)
    await layered.beat("host:1/10", "{}", 10_000)
    assert await layered.announce("reset") == 1
    assert await layered.reports() == {"host:1/10": "{}"}
