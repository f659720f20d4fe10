"""Concurrent calls of one Lua script, coalesced into pipelines.

A busy daemon has many decisions waiting on Redis at once. Sent one by one, each pays
for a trip through redis-py, a connection checkout, a write and a read; that is most of
what a decision costs. Here a call only queues its EVALSHA; once per event-loop turn
everything queued goes out as one pipeline (no MULTI: each script is atomic on its own
and the calls are independent), and each caller gets its own reply or its own error.
Under load N decisions cost one write and one read; alone, a call goes out on the very
next loop turn, so nothing waits for company.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, ResponseError

# Calls per pipeline. Small, so that a busy turn goes out as several pipelines: Redis runs
# the first while the daemon is still packing the next and reads the first's replies while
# Redis runs the rest. One pipeline per turn left one side idle while the other worked
# (bench/peers.py: 8 gave ~1.4x the checks/s of 256 on two cores; 2 lost to syscalls).
MAX_BATCH = 8

_Call = tuple[Sequence[str], Sequence[Any], "asyncio.Future[Any]"]


class ScriptPipeline:
    """Runs `script` by SHA for many concurrent callers, a pipeline per loop turn."""

    def __init__(self, client: aioredis.Redis, script: str, max_batch: int = MAX_BATCH) -> None:
        self._client = client
        self._script = script
        self.sha = hashlib.sha1(script.encode()).hexdigest()  # what SCRIPT LOAD answers
        self._evalsha = _bulk(b"EVALSHA") + _bulk(self.sha.encode())
        self._max_batch = max_batch
        self._queued: list[_Call] = []
        self._sending: set[asyncio.Task[None]] = set()  # held, or the loop may drop them

    async def load(self) -> None:
        """Load the script (also proves the store answers)."""
        await self._client.script_load(self._script)

    async def call(self, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """The script's reply for `keys` and `args` (strings, numbers, `Encoded` runs);
        Redis' own errors are raised as-is."""
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[Any] = loop.create_future()
        if not self._queued:
            loop.call_soon(self._flush)  # after every caller ready in this turn has queued
        self._queued.append((keys, args, reply))
        return await reply

    def _flush(self) -> None:
        # A caller that already gave up (the store deadline) is not sent: it would consume.
        queued = [call for call in self._queued if not call[2].done()]
        self._queued = []
        for start in range(0, len(queued), self._max_batch):
            task = asyncio.ensure_future(self._send(queued[start : start + self._max_batch]))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _send(self, batch: list[_Call]) -> None:
        try:
            replies = await self._execute(batch)
        except BaseException as exc:  # the connection failed: every caller hears of it
            for _, _, reply in batch:
                if not reply.done():
                    reply.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, _, reply), answer in zip(batch, replies, strict=True):
            if reply.done():  # its caller gave up (the store deadline)
                continue
            if isinstance(answer, Exception):
                reply.set_exception(answer)
            else:
                reply.set_result(answer)

    async def _execute(self, batch: list[_Call]) -> list[Any]:
        replies = await self._pipeline(batch)
        missing = [i for i, answer in enumerate(replies) if isinstance(answer, NoScriptError)]
        if missing:  # Redis restarted or SCRIPT FLUSH: load it again, and retry those once
            await self.load()
            retried = await self._pipeline([batch[i] for i in missing])
            for i, answer in zip(missing, retried, strict=True):
                replies[i] = answer
        return replies

    async def _pipeline(self, batch: list[_Call]) -> list[Any]:
        """One write, then one reply per call (a Redis error as its value) on one connection.

        Commands are packed here rather than by redis-py: its packer, made for any command,
        cost more per decision than everything else on the daemon's side of Redis.
        """
        packed = b"".join(_pack(self._evalsha, keys, args) for keys, args, _ in batch)
        pool = self._client.connection_pool
        connection = await pool.get_connection()  # type: ignore[no-untyped-call]
        # One deadline for all the replies rather than redis-py's per reply: a timer per
        # decision saved, and the pipeline as a whole still bounded by the socket timeout.
        deadline, connection.socket_timeout = connection.socket_timeout, None
        try:
            async with asyncio.timeout(deadline):
                await connection.send_packed_command(packed, check_health=False)
                replies: list[Any] = []
                for _ in batch:
                    try:
                        replies.append(await connection.read_response())
                    except ResponseError as exc:  # this call's own error; still in step
                        replies.append(exc)
        except BaseException:
            # Replies may still be on their way: this connection can never be trusted again.
            await connection.disconnect()
            raise
        finally:
            connection.socket_timeout = deadline
            await pool.release(connection)
        return replies

    async def aclose(self) -> None:
        """Wait for the pipelines already sent (their callers are waiting on them)."""
        if self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)


@dataclass(frozen=True, slots=True)
class Encoded:
    """Script arguments already in RESP (`count` of them), encoded once and sent as is.

    A decision's arguments are mostly constants of its rules (kind, limit, window...):
    the store encodes those once (`encoded`, cached) instead of once per call.
    """

    resp: bytes
    count: int


def encoded(*args: Any) -> Encoded:
    return Encoded(b"".join(_bulk(_text(a)) for a in args), len(args))


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%b\r\n" % (len(value), value)


def _text(value: Any) -> bytes:
    """Strings as UTF-8, numbers as decimals."""
    return value.encode() if isinstance(value, str) else str(value).encode()


def _pack(evalsha: bytes, keys: Sequence[str], args: Sequence[Any]) -> bytes:
    """EVALSHA sha numkeys keys... args... in RESP; `Encoded` arguments as they are."""
    # Written out rather than through _bulk and _text: two calls per argument saved.
    parts = [_bulk(b"%d" % len(keys))]
    for key in keys:
        raw = key.encode()
        parts.append(b"$%d\r\n%b\r\n" % (len(raw), raw))
    count = len(parts)
    for arg in args:
        if type(arg) is Encoded:
            parts.append(arg.resp)
            count += arg.count
            continue
        raw = arg.encode() if type(arg) is str else str(arg).encode()
        parts.append(b"$%d\r\n%b\r\n" % (len(raw), raw))
        count += 1
    return b"*%d\r\n%b%b" % (count + 2, evalsha, b"".join(parts))
