"""The store's notification operations (store/base.py `NoticeLog`), the same on every
store: a claim is taken once until it expires; a tally adds counts and keeps them for
their TTL. And on a real Redis, many processes racing for one claim: exactly one wins."""

from __future__ import annotations

import asyncio
import multiprocessing

import redis.asyncio as aioredis

from ratewarden.clock import FakeClock
from ratewarden.store import Store
from ratewarden.store.base import Layer
from ratewarden.store.keys import all_keys_pattern, notice_key, refusal_count_key
from ratewarden.store.redis_store import RedisStore


async def test_a_claim_is_taken_once_until_it_expires(store: Store, clock: FakeClock) -> None:
    key = notice_key("budget.soft_limit", "daily", [("user", "alice")], 1_000)
    assert await store.claim(key, 300) is True
    assert await store.claim(key, 300) is False
    assert await store.claim(
        notice_key("budget.soft_limit", "daily", [("user", "bob")], 1_000), 300
    )
    clock.advance(400)  # the memory store's clock; a real Redis's expiry moves by itself:
    await asyncio.sleep(0.4)  # a real pause, past the 300 ms it was given
    assert await store.claim(key, 300) is True  # the next period's notification


async def test_a_tally_adds_each_count_and_answers_the_totals_in_order(
    store: Store, clock: FakeClock
) -> None:
    alice, bob = refusal_count_key("r", "alice", 0), refusal_count_key("r", "bob", 0)
    assert await store.tally([]) == []
    assert await store.tally([(alice, 3, 10_000), (bob, 1, 10_000)]) == [3, 1]
    assert await store.tally([(alice, 2, 300)]) == [5]
    clock.advance(400)
    await asyncio.sleep(0.4)
    assert await store.tally([(alice, 1, 10_000), (bob, 1, 10_000)]) == [1, 2]


async def test_notification_keys_are_out_of_reach_of_a_reset(store: Store) -> None:
    key = notice_key("budget.exhausted", "daily", [("user", "alice")], 0)
    await store.claim(key, 10_000)
    await store.tally([(refusal_count_key("daily", "alice", 0), 1, 10_000)])
    await store.reset(all_keys_pattern())
    assert await store.claim(key, 10_000) is False


def test_keys_encode_every_part_so_no_name_reaches_another_key() -> None:
    tricky = notice_key("e", "r", [("user", "a}|user=b"), ("team", None)], 5)
    assert tricky == "rw:notify:{e|r|user=a%7D%7Cuser%3Db|team=|5}"
    assert refusal_count_key("r", "a|b", 5) == "rw:notify:{refused|r|user=a%7Cb|5}"
    assert notice_key("e", "r", [("args.path", "ab12")], 0) == "rw:notify:{e|r|args[path]=ab12|0}"


async def test_a_layer_passes_them_through(store: Store) -> None:
    layered = Layer(store)
    assert await layered.claim("rw:notify:{x}", 10_000) is True
    assert await layered.tally([("rw:notify:{y}", 2, 10_000)]) == [2]


def _racer(url: str, start: multiprocessing.synchronize.Barrier, results: list[bool]) -> None:
    async def one() -> bool:
        store = RedisStore(aioredis.Redis.from_url(url), url)
        try:
            start.wait()
            return await store.claim("rw:notify:{race}", 60_000)
        finally:
            await store.close()

    results.append(asyncio.run(one()))


def test_of_many_processes_racing_for_one_claim_exactly_one_wins(redis_url: str) -> None:
    context = multiprocessing.get_context("spawn")
    racers = 8
    with context.Manager() as manager:
        results = manager.list()
        start = manager.Barrier(racers)
        processes = [
            context.Process(target=_racer, args=(redis_url, start, results)) for _ in range(racers)
        ]
        for process in processes:
            process.start()
        for process in processes:
            process.join(60)
        assert sorted(results) == [False] * (racers - 1) + [True]
