"""Stores keep the counters. One URL picks one: `memory://`, `redis://`, `rediss://`, `unix://`,
`redis+sentinel://`, `redis+cluster://`."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from ratewarden.clock import Clock
from ratewarden.errors import RatewardenError
from ratewarden.limiter.script import SPEND_RETENTION_DAYS
from ratewarden.store.base import Store, StoreError
from ratewarden.store.deadlines import STALL_CAP
from ratewarden.store.memory import MemoryStore
from ratewarden.store.snapshot import StateFile, StateFileError

REDIS_SCHEMES = ("redis", "rediss", "unix")


class StoreURLError(RatewardenError, ValueError):
    """A store URL ratewarden cannot use; the message says what would work."""


def store_from_url(
    url: str,
    *,
    timeout_ms: int = 100,
    clock: Clock | None = None,
    state_file: Path | None = None,
    state_interval_s: float = 5.0,
    spend_retention_days: int = SPEND_RETENTION_DAYS,
) -> Store:
    """Build the store `url` names. Nothing connects until `start()`.

    `spend_retention_days`: how long each budget's spend of a day is kept (0: none).

    `state_file` (memory:// only) is loaded here: a file that cannot be used is refused
    with StoreURLError, before the daemon binds its port.
    """
    scheme = urlsplit(url).scheme
    if scheme == "memory":
        if state_file is None:
            return MemoryStore(clock, spend_retention_days=spend_retention_days)
        try:
            state = StateFile(state_file, state_interval_s)
            return MemoryStore(clock, state, spend_retention_days)
        except StateFileError as exc:
            raise StoreURLError(str(exc)) from exc
    if scheme in REDIS_SCHEMES:
        import redis.asyncio as aioredis

        from ratewarden.store.redis_store import RedisStore, connection_options

        # The guarded store's deadline bounds every operation at the store timeout, not
        # counting the time the daemon was stalled (store/deadlines.py). redis-py's own
        # socket timeouts count every second: they are the backstop, at the deadline's
        # cap, or a stall would fail a command whose answer is waiting in the socket.
        timeout = timeout_ms * STALL_CAP / 1000
        client = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            decode_responses=False,
            **connection_options(),
        )
        return RedisStore(client, redact(url), clock, spend_retention_days)
    if scheme in ("redis+sentinel", "redis+cluster"):
        return _replicated_store(url, scheme, timeout_ms, clock, spend_retention_days)
    raise StoreURLError(
        f"unsupported store URL {redact(url)!r}; use memory://, redis://HOST:PORT/DB, "
        "rediss://HOST:PORT/DB, unix:///path/to/redis.sock, "
        f"{SENTINEL_FORM} or {CLUSTER_FORM}"
    )


SENTINEL_FORM = "redis+sentinel://[:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]"
CLUSTER_FORM = "redis+cluster://[:PASSWORD@]HOST:PORT[,HOST:PORT...]"


def _replicated_store(
    url: str, scheme: str, timeout_ms: int, clock: Clock | None, spend_retention_days: int
) -> Store:
    """Sentinel (the single-node store on the current master) or Cluster (per slot)."""
    from ratewarden.store.cluster import cluster_store_from_url
    from ratewarden.store.sentinel import sentinel_store_from_url
    from ratewarden.store.urls import URLProblem

    try:
        if scheme == "redis+sentinel":
            return sentinel_store_from_url(
                url,
                redact(url),
                timeout_ms=timeout_ms,
                clock=clock,
                spend_retention_days=spend_retention_days,
            )
        return cluster_store_from_url(
            url,
            redact(url),
            timeout_ms=timeout_ms,
            clock=clock,
            spend_retention_days=spend_retention_days,
        )
    except URLProblem as exc:
        form = SENTINEL_FORM if scheme == "redis+sentinel" else CLUSTER_FORM
        raise StoreURLError(f"bad store URL {redact(url)!r}: {exc}; expected {form}") from exc


def redact(url: str) -> str:
    """The URL without its password, for logs and start-up messages."""
    parts = urlsplit(url)
    if "sentinel_password=" in parts.query:
        query = re.sub(r"(sentinel_password=)[^&]*", r"\1***", parts.query)
        parts = parts._replace(query=query)
        url = urlunsplit(parts)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


__all__ = ["MemoryStore", "Store", "StoreError", "StoreURLError", "redact", "store_from_url"]
