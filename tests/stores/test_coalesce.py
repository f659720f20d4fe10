"""Concurrent decisions share pipelines (store/coalesce.py), on a real redis-server.

Coalescing must change the number of writes and nothing else: every decision is
still its own EVALSHA (one atomic step), exactness holds, one call's error stays its
own, a flushed script is loaded again, and a caller that gave up is never sent.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from ratewarden.calls import Call
from ratewarden.engine import Engine
from ratewarden.policy import parse_policy
from ratewarden.store.coalesce import ScriptPipeline, encoded
from ratewarden.store.redis_store import RedisStore
from tests.helpers.redis_server import RedisServer, free_port, running_redis

pytestmark = pytest.mark.redis

POLICY = b"""\
version: 1
rules:
  - {name: per-user, per: [user], rate: 50/minute}
  - {name: per-tool, per: [tool], rate: 1000/minute}
"""


class CountingPipeline(ScriptPipeline):
    """Counts writes: each `_send` is one write of every call queued in a loop turn."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.writes: list[int] = []  # calls per write

    async def _send(self, batch: list[Any]) -> None:
        self.writes.append(len(batch))
        await super()._send(batch)


def counting_store(url: str) -> tuple[RedisStore, CountingPipeline]:
    client = aioredis.Redis.from_url(url)
    store = RedisStore(client, url)
    script = CountingPipeline(client, store._script._script)
    store._script = script
    return store, script


async def test_concurrent_checks_share_a_write_and_stay_exact_and_in_order(
    redis_url: str,
) -> None:
    store, script = counting_store(redis_url)
    await store.start()
    try:
        engine = Engine(parse_policy(POLICY), store)
        calls = [Call(user="alice", tool="terminal", call_id=f"c{i}") for i in range(120)]
        decisions = await asyncio.gather(*(engine.check(call) for call in calls))
    finally:
        await store.close()
    # Every decision was sent, once, and a loop turn's calls go out as one write.
    assert sum(script.writes) == 120
    assert len(script.writes) <= 3, script.writes
    # One connection, so Redis runs them in the order the callers came: the first 50 win.
    assert [d.decision for d in decisions] == ["allow"] * 50 + ["deny"] * 70


async def test_a_lone_call_goes_out_at_once(redis_url: str) -> None:
    store, script = counting_store(redis_url)
    await store.start()
    try:
        engine = Engine(parse_policy(POLICY), store)
        for i in range(3):
            decision = await engine.check(Call(user="bob", tool="t", call_id=f"b{i}"))
            assert decision.decision == "allow"
    finally:
        await store.close()
    assert script.writes == [1, 1, 1]


async def test_calls_from_many_turns_each_get_their_own_reply(redis_server: RedisServer) -> None:
    """Writes from different loop turns follow each other on one connection before their
    replies are read; the replies, read in order, still reach the right callers."""
    client = aioredis.Redis.from_url(redis_server.url)
    script = CountingPipeline(client, "return ARGV[1]")
    await script.load()

    async def caller(n: int) -> bytes:
        await asyncio.sleep((n % 7) / 2000)  # spread over many loop turns
        answer: bytes = await script.call([], [n])
        return answer

    try:
        answers = await asyncio.gather(*(caller(n) for n in range(600)))
        assert answers == [str(n).encode() for n in range(600)]
        assert len(script.writes) > 1
        clients = await client.client_list()
        assert sum(1 for c in clients if c["cmd"] == "evalsha") == 1  # one connection
    finally:
        await script.aclose()
        await client.aclose()


async def test_answered_callers_send_again_while_replies_are_still_handed_out(
    redis_server: RedisServer,
) -> None:
    """The reader hands out a burst of replies a few at a time (HAND_OUT), so callers it
    answered first get their next calls written while later replies still wait: Redis
    works while the daemon does, instead of the two taking turns."""
    client = aioredis.Redis.from_url(redis_server.url)
    script = ScriptPipeline(client, "return 1")
    await script.load()
    pending_at_write: list[int] = []
    send = script._send

    async def counting_send(batch: list[Any]) -> None:
        stream = script._stream
        pending_at_write.append(len(stream.awaiting) if stream else 0)
        await send(batch)

    script._send = counting_send  # type: ignore[method-assign]

    async def caller() -> None:
        for _ in range(5):
            assert await script.call([], []) == 1

    try:
        await asyncio.gather(*(caller() for _ in range(64)))  # bursts of 64 replies
    finally:
        await script.aclose()
        await client.aclose()
    assert max(pending_at_write) > 0, pending_at_write


async def test_a_write_does_not_wait_for_the_replies_before_it(tmp_path: Path) -> None:
    with running_redis(tmp_path / "redis") as server:
        client = aioredis.Redis.from_url(server.url, socket_timeout=5)
        script = CountingPipeline(client, "return ARGV[1]")
        try:
            await script.load()
            assert await script.call([], ["warm"]) == b"warm"
            os.kill(server.process.pid, signal.SIGSTOP)  # no reply until it goes on
            try:
                first = asyncio.ensure_future(script.call([], ["first"]))
                for _ in range(5):
                    await asyncio.sleep(0.01)
                second = asyncio.ensure_future(script.call([], ["second"]))
                for _ in range(5):
                    await asyncio.sleep(0.01)
                assert not first.done()
                assert script.writes == [1, 1, 1]  # the second went out behind the first
            finally:
                os.kill(server.process.pid, signal.SIGCONT)
            assert list(await asyncio.gather(first, second)) == [b"first", b"second"]
        finally:
            await script.aclose()
            await client.aclose()


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


async def test_a_frozen_redis_fails_every_waiting_call_at_the_socket_timeout(
    tmp_path: Path,
) -> None:
    """The replies share one deadline, the connection's socket timeout, for each next
    reply (not a timer per call); a frozen Redis ends every caller within it, and the
    connection goes back to the pool with its own timeout, for the commands after it."""
    with running_redis(tmp_path / "redis") as server:
        client = aioredis.Redis.from_url(server.url, socket_timeout=0.2)
        script = ScriptPipeline(client, "return 1")
        pool = client.connection_pool
        try:
            await script.load()
            assert await asyncio.gather(*(script.call([], []) for _ in range(20))) == [1] * 20
            held = list(pool._in_use_connections)
            assert len(held) == 1  # the script's connection, its timeout off while held
            assert held[0].socket_timeout is None
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
            await asyncio.sleep(0.05)  # the broken connection is given back
            assert held[0].socket_timeout == 0.2
            assert held[0] not in pool._in_use_connections
            assert await script.call([], []) == 1  # a fresh connection, its own reply
        finally:
            await script.aclose()
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
