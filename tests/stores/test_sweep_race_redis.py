"""The budget sweep under real concurrency, on a real redis-server whose `TIME` is the clock.

Thirty users each reserve one call (1 s reservations) and never come back. Once the
reservations expired, four spawned processes, each with its own Engine and RedisStore,
wait on a barrier and then sweep at once, with no claim to keep them apart (the worst
case: a claim lost to a store failover), in small steps so that their walks interleave;
meanwhile each settles a share of the calls, late, at costs other than their estimates.
Every budget then holds exactly what the oracle says: the actual cost of a settled call,
the estimate of an unsettled one; its spend records add up to the same; the sweeps
charged nothing twice. With the claim, one process of four sweeps and the others do not.
"""

from __future__ import annotations

import asyncio
import traceback
from typing import Any

import pytest

from ratewarden.calls import Call
from ratewarden.engine import Engine
from ratewarden.policy import parse_policy
from ratewarden.service.sweep import BudgetSweeper
from ratewarden.store import store_from_url
from ratewarden.store.keys import parse_spend_key
from tests.helpers.races import race
from tests.helpers.redis_server import RedisServer
from tests.stores.test_budget_race_redis import race_policy

pytestmark = pytest.mark.redis

PROCESSES, USERS = 4, 30
ESTIMATE = 200_000  # 0.20
STEP = 7  # counters per sweep step: a walk of 30 takes five, and the four interleave


def settled_by(user: int) -> int | None:
    """The worker that settles `user`'s call late, or None (left unsettled)."""
    return user % PROCESSES if user % 3 == 0 else None


def actual(user: int) -> int:
    return (user % 5) * 90_000  # 0.00 to 0.36: below and above the estimate


def oracle(user: int) -> int:
    return ESTIMATE if settled_by(user) is None else actual(user)


def policy(server: RedisServer) -> str:
    return race_policy(server, ", reservation_ttl: 1s").replace("5.00/day", "100.00/day")


async def _reserve(url: str, text: str) -> None:
    store = store_from_url(url, timeout_ms=20_000)
    try:
        engine = Engine(parse_policy(text.encode()), store)
        await store.start()
        for user in range(USERS):
            call = Call(f"user-{user}", "t", f"c{user}", cost=ESTIMATE / 1e6)
            assert (await engine.check(call)).allowed
    finally:
        await store.close()


async def _sweep(url: str, text: str, barrier: Any, worker: int, claimed: bool) -> int:
    store = store_from_url(url, timeout_ms=20_000)
    try:
        engine = Engine(parse_policy(text.encode()), store)
        await store.start()
        step = USERS if claimed else STEP  # with the claim, one whole walk a tick
        sweeper = BudgetSweeper(store, engine, 60, f"w{worker}", timeout_s=20, batch=step)
        barrier.wait(timeout=60)
        if claimed:
            return await sweeper.tick()

        async def sweeps() -> int:
            charged = 0
            for _ in range(2 * USERS // STEP + 2):  # two whole walks at least
                charged += await sweeper.sweep()
                await asyncio.sleep(0)
            return charged

        async def settles() -> None:
            for user in range(USERS):
                if settled_by(user) == worker:
                    settled = await engine.settle(f"c{user}", actual(user) / 1e6)
                    assert settled.outcome == "settled", settled

        charged, _ = await asyncio.gather(sweeps(), settles())
        return charged
    finally:
        await store.close()


def _worker(url: str, text: str, claimed: bool, barrier: Any, results: Any, worker: int) -> None:
    try:
        results.put((worker, asyncio.run(_sweep(url, text, barrier, worker, claimed))))
    except BaseException:
        results.put((worker, traceback.format_exc()))


async def _expire(url: str, text: str) -> None:
    await _reserve(url, text)
    await asyncio.sleep(1.3)  # every reservation expired by Redis TIME, none charged yet


def _charged(outcomes: list[Any]) -> list[int]:
    for worker, outcome in outcomes:
        assert isinstance(outcome, int), f"worker {worker} failed:\n{outcome}"
    return [outcome for _, outcome in outcomes]


async def test_racing_sweeps_and_late_settles_charge_each_reservation_once(
    redis_server: RedisServer, redis_url: str
) -> None:
    text = policy(redis_server)
    await _expire(redis_url, text)
    client = redis_server.client()
    assert not list(client.scan_iter(match="rw:spend:*"))  # nothing charged before the race
    outcomes, codes = race(_worker, (redis_url, text, False), PROCESSES)
    charged = _charged(outcomes)
    assert codes == [0] * PROCESSES

    recorded: dict[str, int] = {}
    for key in client.scan_iter(match="rw:spend:*"):
        parsed = parse_spend_key(key.decode())
        assert parsed is not None
        assert parsed.rule == "spend"
        name = dict(parsed.scope)["user"]
        recorded[name] = recorded.get(name, 0) + int(client.get(key) or 0)
    for user in range(USERS):
        counter: dict[bytes, bytes] = client.hgetall(f"rw:{{spend|user=user-{user}}}:bg")  # type: ignore[assignment]
        assert int(counter[b"s"]) == oracle(user), (user, counter)
        assert int(counter[b"r"]) == 0
        assert not [f for f in counter if f.startswith(b"h:")]  # nothing left reserved
        assert recorded.get(f"user-{user}", 0) == oracle(user), user
    client.close()
    # Each reservation charged by one sweep at most: the unsettled ones surely, a settled
    # one when a sweep came before its settle (which then corrected it).
    unsettled = sum(1 for user in range(USERS) if settled_by(user) is None)
    assert unsettled * ESTIMATE <= sum(charged) <= USERS * ESTIMATE


async def test_with_the_claim_one_process_of_four_sweeps(
    redis_server: RedisServer, redis_url: str
) -> None:
    text = policy(redis_server)
    await _expire(redis_url, text)
    outcomes, codes = race(_worker, (redis_url, text, True), PROCESSES)
    charged = sorted(_charged(outcomes))
    assert codes == [0] * PROCESSES
    assert charged == [0, 0, 0, USERS * ESTIMATE]
