"""Concurrent decisions share pipelines (store/coalesce.py), on a real redis-server.

Coalescing must change the number of round trips and nothing else: every decision is
still its own EVALSHA (one atomic step), exactness holds, one call's error stays its
own, a flushed script is loaded again, and a caller that gave up is never sent.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from ratewarden.calls import Call
from ratewarden.engine import Engine
from ratewarden.policy import parse_policy
from ratewarden.store.coalesce import MAX_BATCH, ScriptPipeline, encoded
from ratewarden.store.redis_store import RedisStore
from tests.redis_server import RedisServer, free_port, running_redis

pytestmark = pytest.mark.redis

POLICY = b"""\
version: 1
rules:
  - {name: per-user, per: [user], rate: 50/minute}
  - {name: per-tool, per: [tool], rate: 1000/minute}
"""


class CountingPipeline(ScriptPipeline):
    """Counts round trips: each `_pipeline` is one write and one read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.round_trips: list[int] = []  # calls per round trip

    async def _pipeline(self, batch: list[Any]) -> list[Any]:
        self.round_trips.append(len(batch))
        return await super()._pipeline(batch)


def counting_store(url: str) -> tuple[RedisStore, CountingPipeline]:
    client = aioredis.Redis.from_url(url)
    store = RedisStore(client, url)
    script = CountingPipeline(client, store._script._script)
    store._script = script
    return store, script


async def test_concurrent_checks_share_round_trips_and_stay_exact(redis_url: str) -> None:
    store, script = counting_store(redis_url)
    await store.start()
    try:
        engine = Engine(parse_policy(POLICY), store)
        calls = [Call(user="alice", tool="terminal", call_id=f"c{i}") for i in range(120)]
        decisions = await asyncio.gather(*(engine.check(call) for call in calls))
    finally:
        await store.close()
    assert Counter(d.decision for d in decisions) == {"allow": 50, "deny": 70}
    # Every decision was sent, once, in full pipelines: far fewer round trips than decisions
    # (each event-loop turn leaves at most one pipeline short of MAX_BATCH).
    assert sum(script.round_trips) == 120
    assert max(script.round_trips) == MAX_BATCH, script.round_trips
    assert len(script.round_trips) <= 120 // MAX_BATCH + 3, script.round_trips
    # Which 50 is not fixed: a turn's pipelines run on separate connections, in any order,
    # as concurrent requests would.


async def test_a_lone_call_goes_out_at_once_without_a_pipeline(redis_url: str) -> None:
    store, script = counting_store(redis_url)
    await store.start()
    try:
        engine = Engine(parse_policy(POLICY), store)
        for i in range(3):
            decision = await engine.check(Call(user="bob", tool="t", call_id=f"b{i}"))
            assert decision.decision == "allow"
    finally:
        await store.close()
    assert script.round_trips == [1, 1, 1]


async def test_one_calls_error_is_its_own(redis_server: RedisServer) -> None:
    """A call whose counter key holds the wrong type fails; the others in its pipeline don't."""
    client = aioredis.Redis.from_url(redis_server.url)
    script = ScriptPipeline(client, "return redis.call('INCR', KEYS[1])")
    await script.load()
    await client.hset("broken", "field", "1")
    try:
        answers = await asyncio.gather(
            *(script.call([key], []) for key in ["a", "broken", "b", "a"]),
            return_exceptions=True,
        )
    finally:
        await client.aclose()
    assert answers[0] == 1
    assert isinstance(answers[1], ResponseError)
    assert "WRONGTYPE" in str(answers[1])
    assert answers[2:] == [1, 2]


async def test_a_flushed_script_is_loaded_again_for_a_whole_pipeline(
    redis_server: RedisServer,
) -> None:
    client = aioredis.Redis.from_url(redis_server.url)
    script = ScriptPipeline(client, "return tonumber(ARGV[1]) * 2")
    try:
        await script.load()
        await client.script_flush()
        answers = await asyncio.gather(*(script.call([], [n]) for n in range(10)))
        assert answers == [n * 2 for n in range(10)]
        await client.script_flush()
        assert await script.call([], [21]) == 42  # a lone call too
    finally:
        await client.aclose()


async def test_encoded_arguments_reach_the_script_as_plain_ones(
    redis_server: RedisServer,
) -> None:
    """A rule's constant arguments are encoded once (`encoded`); the script must see the
    very arguments, in order and count, that the same values sent plainly give."""
    client = aioredis.Redis.from_url(redis_server.url)
    script = ScriptPipeline(client, "return {#KEYS, unpack(ARGV)}")
    try:
        await script.load()
        values = ["decide", 1, "", "caf\u00e9|\n", 2.5, 0]
        plain = await script.call(["k1", "k2"], values)
        mixed = await script.call(
            ["k1", "k2"], [encoded("decide", 1), "", encoded("caf\u00e9|\n", 2.5), 0]
        )
        assert plain == mixed == [2, b"decide", b"1", b"", "caf\u00e9|\n".encode(), b"2.5", b"0"]
        assert await script.call([], [encoded(), "x", encoded("y")]) == [0, b"x", b"y"]
    finally:
        await client.aclose()


async def test_a_caller_that_gave_up_is_not_sent(redis_server: RedisServer) -> None:
    client = aioredis.Redis.from_url(redis_server.url)
    script = ScriptPipeline(client, "return redis.call('INCR', KEYS[1])")
    await script.load()
    try:
        patient = asyncio.ensure_future(script.call(["sent"], []))
        impatient = asyncio.ensure_future(script.call(["never"], []))
        await asyncio.sleep(0)  # both queued; the flush is due on the next loop turn
        impatient.cancel()
        assert await patient == 1
        assert impatient.cancelled()
        assert await client.exists("never") == 0
    finally:
        await client.aclose()


async def test_a_pipeline_is_cut_at_the_socket_timeout_and_leaves_it_as_it_was(
    tmp_path: Path,
) -> None:
    """A pipeline's replies share one deadline, the connection's socket timeout, instead
    of one timer per reply; a frozen Redis still ends every caller within it, and the
    connection the pipeline borrowed keeps its own timeout for the commands after it."""
    with running_redis(tmp_path / "redis") as server:
        client = aioredis.Redis.from_url(server.url, socket_timeout=0.2)
        script = ScriptPipeline(client, "return 1")
        try:
            await script.load()
            assert await asyncio.gather(*(script.call([], []) for _ in range(20))) == [1] * 20
            pooled = client.connection_pool._available_connections  # type: ignore[attr-defined]
            assert pooled
            assert all(c.socket_timeout == 0.2 for c in pooled)
            os.kill(server.process.pid, signal.SIGSTOP)
            try:
                started = time.monotonic()
                answers = await asyncio.gather(
                    *(script.call([], []) for _ in range(3)), return_exceptions=True
                )
                elapsed = time.monotonic() - started
            finally:
                os.kill(server.process.pid, signal.SIGCONT)
            assert all(isinstance(a, TimeoutError) for a in answers), answers
            assert 0.2 <= elapsed < 1.0, elapsed
            assert all(c.socket_timeout == 0.2 for c in pooled)
            assert await script.call([], []) == 1  # a fresh connection, its own reply
        finally:
            await client.aclose()


async def test_a_dead_connection_fails_every_caller_of_its_pipeline() -> None:
    client = aioredis.Redis(port=free_port())  # nothing listens there
    script = ScriptPipeline(client, "return 1")
    try:
        answers = await asyncio.gather(
            *(script.call(["k"], []) for _ in range(5)), return_exceptions=True
        )
    finally:
        await client.aclose()
    assert all(isinstance(a, RedisConnectionError) for a in answers), answers
