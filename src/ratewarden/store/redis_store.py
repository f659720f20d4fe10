"""Redis stores (`redis://`, `rediss://`, `unix://`): one EVALSHA per decision."""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, RedisError

from ratewarden.clock import Clock
from ratewarden.limiter.ops import ALGORITHM_CODES, CounterOp, OpResult
from ratewarden.limiter.reference import to_result
from ratewarden.store.base import StoreError

DECIDE_LUA = resources.files("ratewarden.limiter").joinpath("decide.lua").read_text()


class RedisStore:
    """Runs `decide.lua` by SHA; time comes from Redis `TIME` unless a clock is injected.

    The injected clock exists for tests, so the same fake-clock scenarios run on the
    memory store, fakeredis and a real redis-server.
    """

    def __init__(
        self, client: aioredis.Redis, description: str, clock: Clock | None = None
    ) -> None:
        self._client = client
        self._description = description
        self._clock = clock
        self._sha = ""

    @property
    def description(self) -> str:
        return self._description

    async def start(self) -> None:
        try:
            self._sha = await self._client.script_load(DECIDE_LUA)
        except RedisError as exc:
            raise StoreError(f"cannot load the decision script: {exc}") from exc

    async def evaluate(self, ops: Sequence[CounterOp], dry_run: bool = False) -> list[OpResult]:
        keys = [op.key for op in ops]
        args: list[Any] = [
            str(self._clock.now_ms()) if self._clock else "",
            "1" if dry_run else "0",
        ]
        for op in ops:
            args += (ALGORITHM_CODES[op.algorithm], int(op.role), op.limit, op.window_ms, op.burst)
        try:
            reply = await self._run(keys, args)
        except (RedisError, OSError) as exc:
            raise StoreError(f"{type(exc).__name__}: {exc}") from exc
        return [
            to_result(
                op,
                bool(reply[i]),
                reply[i + 1],
                None if reply[i + 2] < 0 else reply[i + 2],
                reply[i + 3],
            )
            for op, i in zip(ops, range(1, len(reply), 4), strict=True)
        ]

    async def _run(self, keys: list[str], args: list[Any]) -> list[int]:
        if not self._sha:
            await self.start()
        try:
            reply: list[int] = await self._client.evalsha(self._sha, len(keys), *keys, *args)
        except NoScriptError:  # Redis restarted or SCRIPT FLUSH: load again, once
            await self.start()
            reply = await self._client.evalsha(self._sha, len(keys), *keys, *args)
        return reply

    async def ping(self) -> None:
        try:
            await self._client.ping()
        except (RedisError, OSError) as exc:
            raise StoreError(f"{type(exc).__name__}: {exc}") from exc

    async def close(self) -> None:
        await self._client.aclose()
