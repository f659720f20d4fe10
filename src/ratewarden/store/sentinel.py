"""Redis Sentinel (`redis+sentinel://host1:26379,host2:26379/mymaster/0`).

The counters live on the master Sentinel names; the store is the single-node store
(one EVALSHA per decision) on a client that asks the sentinels where the master is
whenever it opens a connection. After a failover, connections to the old master fail
(refused, or READONLY once it is demoted), are dropped, and the next ones go to the new
master; the script is loaded there on first use. Counters survive a failover as far
as replication had carried them to the promoted replica (docs/cluster.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from ratewarden.clock import Clock
from ratewarden.limiter.script import SPEND_RETENTION_DAYS
from ratewarden.store.redis_store import RedisStore, connection_options
from ratewarden.store.urls import URLProblem, parse_hosts

_SENTINEL_OPTIONS = ("sentinel_username", "sentinel_password")


WATCH_INTERVAL_S = 1.0


class SentinelStore(RedisStore):
    """The single-node store on the master a set of sentinels designates.

    redis-py asks the sentinels for the master only when it opens a connection, and a
    demoted master keeps answering on the connections it has until it is told to
    replicate (when a sentinel next polls it, up to 10 s later after `SENTINEL
    FAILOVER`): decisions made there in between would be lost. So the store also asks
    the sentinels every `watch_interval_s`, in the background; when the master has
    moved, idle connections to the old one are closed, busy ones when released, and the
    script's own connection (store/coalesce.py) is given up for one to the new master.
    """

    def __init__(
        self,
        sentinel: Sentinel,
        service: str,
        client: aioredis.Redis,
        description: str,
        clock: Clock | None = None,
        watch_interval_s: float = WATCH_INTERVAL_S,
        spend_retention_days: int = SPEND_RETENTION_DAYS,
    ) -> None:
        super().__init__(client, description, clock, spend_retention_days)
        self.sentinel = sentinel
        self.service = service
        self.watch_interval_s = watch_interval_s
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._watch is None or self._watch.done():
            self._watch = asyncio.get_running_loop().create_task(self._watch_master())
        await super().start()

    async def master_address(self) -> tuple[str, int]:
        """Where the sentinels say the master is now (and follow it if it moved)."""
        pool = self._client.connection_pool
        assert isinstance(pool, SentinelConnectionPool)
        host, port = await pool.get_master_address()  # type: ignore[no-untyped-call]
        held = self._script.connection
        if held is not None and (held.host, held.port) != (host, port):
            self._script.reconnect()  # the old master's: the next calls go to the new one
        return str(host), int(port)

    async def _watch_master(self) -> None:
        while True:
            await asyncio.sleep(self.watch_interval_s)
            with contextlib.suppress(RedisError, OSError):
                await self.master_address()

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None
        await super().close()
        # The connections to the sentinels themselves (Sentinel.aclose is redis-py 6+).
        await asyncio.gather(
            *(client.aclose() for client in self.sentinel.sentinels), return_exceptions=True
        )


def sentinel_store_from_url(
    url: str,
    description: str,
    *,
    timeout_ms: int = 100,
    clock: Clock | None = None,
    spend_retention_days: int = SPEND_RETENTION_DAYS,
) -> SentinelStore:
    """`redis+sentinel://[[user]:password@]host1:26379,host2:26379/service[/db]`.

    The user and password are the data nodes' (master and replicas); sentinels that
    require a password of their own take `?sentinel_password=...` (and
    `sentinel_username=...`).
    """
    parts = urlsplit(url)
    hosts, user, password = parse_hosts(parts.netloc, 26379)
    path = [unquote(p) for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise URLProblem("name the master's service, and optionally a db: /mymaster/0")
    service, db_text = path[0], (path[1] if len(path) == 2 else "0")
    try:
        db = int(db_text)
    except ValueError:
        raise URLProblem(f"bad database number {db_text!r}") from None
    options = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    unknown = sorted(set(options) - set(_SENTINEL_OPTIONS))
    if unknown:
        raise URLProblem(f"unknown options {', '.join(unknown)}")
    timeout = timeout_ms / 1000
    sockets: dict[str, Any] = {"socket_timeout": timeout, "socket_connect_timeout": timeout}
    # No retries per sentinel: discovery already moves on to the next one, and redis-py's
    # default (10 retries with backoff) would spend seconds on a dead first sentinel.
    sentinel_kwargs: dict[str, Any] = {**sockets, "retry": Retry(NoBackoff(), 0)}
    with contextlib.suppress(KeyError):
        sentinel_kwargs["password"] = options["sentinel_password"]
    with contextlib.suppress(KeyError):
        sentinel_kwargs["username"] = options["sentinel_username"]
    sentinel = Sentinel(hosts, sentinel_kwargs=sentinel_kwargs, **sockets)  # type: ignore[no-untyped-call]
    client = sentinel.master_for(
        service,
        db=db,
        username=user or None,
        password=password or None,
        decode_responses=False,
        **connection_options(),
    )
    return SentinelStore(
        sentinel, service, client, description, clock, spend_retention_days=spend_retention_days
    )
