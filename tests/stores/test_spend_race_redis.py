"""Spend records under real concurrency, on a real redis-server whose `TIME` is the clock.

Four spawned processes, each with its own Engine and RedisStore (no injected clock), wait
on a barrier, reserve 25 calls each on one user's budget and then settle 20 of them at
once, at costs other than their estimates, leaving 5 unsettled. Once those expire (2 s
reservations) and a read charges them at their estimate, the user's spend records add up
to exactly the budget's spent money, which is exactly the settled costs plus the
unsettled estimates: no charge lost or counted twice by a race, whichever came first of a
settle and its reservation's expiry (a settle that loses to the expiry corrects the
estimate already recorded).
"""

from __future__ import annotations

import asyncio
import time
import traceback
from typing import Any

import pytest

from ratewarden.calls import Call
from ratewarden.engine import Engine
from ratewarden.policy import parse_policy
from ratewarden.store import store_from_url
from ratewarden.store.keys import parse_spend_key
from tests.helpers.races import race
from tests.helpers.redis_server import RedisServer
from tests.stores.test_budget_race_redis import BUDGET_KEY, race_policy, redis_now_ms

pytestmark = pytest.mark.redis

PROCESSES, CALLS, SETTLED = 4, 25, 20
ESTIMATE = 200_000  # 0.20


def actual(worker: int, i: int) -> int:
    """A settled call's cost: 0.00 to 0.36, below and above its estimate."""
    return ((worker * 7 + i * 3) % 10) * 40_000


async def _race(url: str, policy_text: str, barrier: Any, worker: int) -> list[str]:
    store = store_from_url(url, timeout_ms=20_000)
    try:
        engine = Engine(parse_policy(policy_text.encode()), store)
        await store.start()
        barrier.wait(timeout=60)
        ids = [f"w{worker}-{i}" for i in range(CALLS)]
        checked = await asyncio.gather(
            *(engine.check(Call("alice", "t", call_id, cost=ESTIMATE / 1e6)) for call_id in ids)
        )
        assert all(d.allowed for d in checked), [d.message for d in checked]
        settled = await asyncio.gather(
            *(engine.settle(ids[i], actual(worker, i) / 1e6) for i in range(SETTLED))
        )
        return [s.outcome for s in settled]
    finally:
        await store.close()


def _worker(url: str, policy_text: str, barrier: Any, results: Any, worker: int) -> None:
    try:
        results.put((worker, asyncio.run(_race(url, policy_text, barrier, worker))))
    except BaseException:
        results.put((worker, traceback.format_exc()))


async def test_racing_settles_and_expiries_add_up_to_the_budgets_spent(
    redis_server: RedisServer, redis_url: str
) -> None:
    policy = race_policy(redis_server, ", reservation_ttl: 2s").replace("5.00/day", "100.00/day")
    started = time.monotonic()
    outcomes, codes = race(_worker, (redis_url, policy), PROCESSES)
    for worker, outcome in outcomes:
        assert isinstance(outcome, list), f"worker {worker} failed:\n{outcome}"
        assert outcome == ["settled"] * SETTLED
    assert codes == [0] * PROCESSES
    store = store_from_url(redis_url, timeout_ms=2_000)
    try:  # until the unsettled reservations expire, and this read charges them
        engine = Engine(parse_policy(policy.encode()), store)
        while (await engine.usage("alice"))[0].reserved != 0:
            assert time.monotonic() - started < 30, "the reservations never expired"
            await asyncio.sleep(0.1)
    finally:
        await store.close()

    client = redis_server.client()
    spent = int(client.hget(BUDGET_KEY, "s") or 0)
    recorded = {}
    for key in client.scan_iter(match="rw:spend:*"):
        parsed = parse_spend_key(key.decode())
        assert parsed is not None
        assert (parsed.rule, parsed.scope) == ("spend", (("user", "alice"),))
        recorded[parsed.day] = int(client.get(key) or 0)
        # kept until the end of its day plus 90 days (by Redis TIME; a second's slack)
        until_ms = (parsed.day + 1 + 90) * 86_400_000 - redis_now_ms(redis_server)
        assert abs(client.pttl(key) - until_ms) < 1000
    client.close()
    settled = sum(actual(w, i) for w in range(PROCESSES) for i in range(SETTLED))
    unsettled = PROCESSES * (CALLS - SETTLED) * ESTIMATE
    assert spent == settled + unsettled
    assert sum(recorded.values()) == spent  # one day, or two if the race met UTC midnight
    assert 1 <= len(recorded) <= 2
