"""Concurrent calls of one Lua script, pipelined on one connection.

A busy daemon has many decisions waiting on Redis at once. Sent one by one, each pays
for a trip through redis-py, a connection checkout, a write and a read; that is most of
what a decision costs. Here a call only queues its EVALSHA; once per event-loop turn
everything queued is written at once to one connection that stays open, without waiting
for the replies to what is already on its way (no MULTI: each script is atomic on its
own and the calls are independent). One reader takes the replies as they come, in the
order the calls were written, and hands each caller its own reply or its own error.

Why one connection and a stream, rather than a pipeline per batch of calls: Redis runs
every command that has arrived before it writes any reply, so pipelines sent side by
side came back together, and the daemon and Redis took turns instead of working at the
same time (five rules: 3 500 decisions/s, each process idle half of the time). On one
connection Redis reads at most 16 kB a turn and answers it, so replies stream back while
the daemon still works on the next calls. Alone, a call goes out on the very next loop
turn, so nothing waits for company.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import deque
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from ratewarden.store.deadlines import Deadlines

# Replies handed out before the reader lets the callers it answered run. Their next calls
# then go out while it still hands out the rest, and Redis works on them meanwhile; a
# reader that handed out a whole burst first made the two take turns again (bench/peers:
# 10 500 checks/s handing out everything, 16 500 by 8, about the same by 4 or 16).
HAND_OUT = 8

# keys, args, the caller's reply, and whether it is already the retry after a NOSCRIPT
_Call = tuple[Sequence[str], Sequence[Any], "asyncio.Future[Any]", bool]


class ScriptPipeline:
    """Runs `script` by SHA for many concurrent callers, pipelined on one connection."""

    def __init__(self, client: aioredis.Redis, script: str) -> None:
        self._client = client
        self._script = script
        self.sha = hashlib.sha1(script.encode()).hexdigest()  # what SCRIPT LOAD answers
        self._evalsha = _bulk(b"EVALSHA") + _bulk(self.sha.encode())
        self._queued: list[_Call] = []  # to be written on the next loop turn
        self._stream: _Stream | None = None  # where calls are written now
        self._opening = asyncio.Lock()
        self._unloaded: list[_Call] = []  # answered NOSCRIPT: sent again once it is loaded
        self._tasks: set[asyncio.Task[None]] = set()  # held, or the loop may drop them

    async def load(self) -> None:
        """Load the script (also proves the store answers)."""
        await self._client.script_load(self._script)

    async def call(self, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """The script's reply for `keys` and `args` (strings, numbers, `Encoded` runs);
        Redis' own errors are raised as-is."""
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue((keys, args, reply, False))
        return await reply

    @property
    def connection(self) -> Any:
        """The connection calls are written on now (None before the first)."""
        return None if self._stream is None else self._stream.connection

    def reconnect(self) -> None:
        """Write the next calls on a new connection from the pool (the master moved); the
        current one still delivers the replies it owes, then goes back to the pool closed
        (it may point at a server we are done with)."""
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.retire()

    def _queue(self, call: _Call) -> None:
        if not self._queued:
            asyncio.get_running_loop().call_soon(self._flush)  # after this turn's callers
        self._queued.append(call)

    def _flush(self) -> None:
        # A caller that already gave up (the store deadline) is not sent: it would consume.
        queued = [call for call in self._queued if not call[2].done()]
        self._queued = []
        if queued:
            self.spawn(self._send(queued))

    async def _send(self, batch: list[_Call]) -> None:
        packed = b"".join(_pack(self._evalsha, keys, args) for keys, args, _, _ in batch)
        try:
            stream = await self._current()
        except Exception as exc:
            _fail(batch, exc)
            return
        await stream.write(batch, packed)

    async def _current(self) -> _Stream:
        pool = self._client.connection_pool
        async with self._opening:
            stream = self._stream
            if stream is not None and not stream.broken:
                if not stream.awaiting:
                    # Idle since its last reply: Redis may have closed it meanwhile (a
                    # restart), which only a read tells. The pool's check on every checkout.
                    await pool.ensure_connection(stream.connection)
                return stream
            connection = await pool.get_connection()  # type: ignore[no-untyped-call]
            self._stream = _Stream(self, pool, connection)
            return self._stream

    def answer(self, call: _Call, answer: Any) -> None:
        """Hand one reply to its caller (a stream's reader calls this, in order)."""
        keys, args, reply, retried = call
        if isinstance(answer, NoScriptError) and not retried:
            # Redis restarted or SCRIPT FLUSH: load it again, and send those calls once more.
            if not self._unloaded:
                self.spawn(self._reload())
            self._unloaded.append((keys, args, reply, True))
        elif reply.done():  # its caller gave up (the store deadline)
            return
        elif isinstance(answer, Exception):
            reply.set_exception(answer)
        else:
            reply.set_result(answer)

    async def _reload(self) -> None:
        try:
            await self.load()
        except Exception as exc:
            calls, self._unloaded = self._unloaded, []
            _fail(calls, exc)
            return
        calls, self._unloaded = self._unloaded, []
        for call in calls:
            self._queue(call)

    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def aclose(self) -> None:
        """Wait for the calls already sent (their callers are waiting on them), then give
        the connection back to the pool."""
        while self._queued or self._tasks:
            await asyncio.sleep(0)  # let a flush that is due go out
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self.reconnect()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class _Stream:
    """One connection: the calls written to it, in the order their replies come, and the
    reader that hands the replies out. Its socket timeout is ours while we hold it."""

    def __init__(self, owner: ScriptPipeline, pool: Any, connection: Any) -> None:
        self._owner = owner
        self._pool = pool  # where the connection came from and goes back to
        self.connection = connection
        # Replies are timed by the reader, one deadline for each next reply (see _read).
        self._timeout, connection.socket_timeout = connection.socket_timeout, None
        self._deadlines = None if self._timeout is None else Deadlines(self._timeout)
        self.awaiting: deque[_Call] = deque()
        self._reader: asyncio.Task[None] | None = None
        self.broken = False
        self._retired = False
        self._returned = False

    async def write(self, batch: list[_Call], packed: bytes) -> None:
        if self.broken:  # failed since the batch was handed to it
            _fail(batch, RedisConnectionError("connection lost"))
            return
        # A call's place in line and its write are taken in one step, no await between
        # (with the socket timeout off, redis-py writes at once, not in a task of its own).
        self.awaiting.extend(batch)
        try:
            async with self._deadline():
                await self.connection.send_packed_command(packed, check_health=False)
        except BaseException as exc:
            self.fail(exc)
            if not isinstance(exc, Exception):
                raise
            return
        if self._reader is None and not self.broken:
            self._reader = self._owner.spawn(self._read())

    async def _read(self) -> None:
        """Replies, in order, while calls await them. The socket timeout bounds the wait
        for each next reply: a connection that gives none for that long is dead to us."""
        try:
            handed = 0
            while self.awaiting and not self.broken:
                try:
                    async with self._deadline():
                        answer = await self.connection.read_response()
                except ResponseError as exc:  # this call's own error; still in step
                    answer = exc
                self._owner.answer(self.awaiting.popleft(), answer)
                handed += 1
                if handed % HAND_OUT == 0:
                    await asyncio.sleep(0)  # see HAND_OUT
        except BaseException as exc:
            self.fail(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._reader = None
            if self._retired and not self.awaiting:
                self._give_back()

    def _deadline(self) -> Any:
        """A block bounded by the socket timeout (unbounded without one)."""
        return contextlib.nullcontext() if self._deadlines is None else self._deadlines()

    def retire(self) -> None:
        """No more writes here; back to the pool once the replies it owes are in."""
        self._retired = True
        if self._reader is None and not self.awaiting:
            self._give_back()

    def fail(self, error: BaseException) -> None:
        """Replies may still be on their way: the connection can never be trusted again.
        Every call written to it hears of the failure."""
        if self.broken:
            return
        self.broken = True
        calls, self.awaiting = list(self.awaiting), deque()
        _fail(calls, error if isinstance(error, Exception) else RedisConnectionError(str(error)))
        self._give_back()

    def _give_back(self) -> None:
        if not self._returned:
            self._returned = True
            self._owner.spawn(self._release())

    async def _release(self) -> None:
        self.connection.socket_timeout = self._timeout
        try:
            await self.connection.disconnect()  # broken, or retired: not to be used as is
        finally:
            await self._pool.release(self.connection)


def _fail(calls: Sequence[_Call], error: BaseException) -> None:
    for _, _, reply, _ in calls:
        if not reply.done():
            reply.set_exception(error)


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
