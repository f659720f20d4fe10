"""Stores keep the counters. One URL picks one: `memory://`, `redis://`, `rediss://`, `unix://`."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from ratewarden.clock import Clock
from ratewarden.store.base import Store, StoreError
from ratewarden.store.memory import MemoryStore

REDIS_SCHEMES = ("redis", "rediss", "unix")


class StoreURLError(ValueError):
    """A store URL ratewarden cannot use; the message says what would work."""


def store_from_url(url: str, *, timeout_ms: int = 100, clock: Clock | None = None) -> Store:
    """Build the store `url` names. Nothing connects until `start()`."""
    scheme = urlsplit(url).scheme
    if scheme == "memory":
        return MemoryStore(clock)
    if scheme in REDIS_SCHEMES:
        import redis.asyncio as aioredis

        from ratewarden.store.redis_store import RedisStore

        timeout = timeout_ms / 1000
        client = aioredis.Redis.from_url(
            url, socket_timeout=timeout, socket_connect_timeout=timeout, decode_responses=False
        )
        return RedisStore(client, redact(url), clock)
    if scheme in ("redis+sentinel", "redis+cluster"):
        raise StoreURLError(f"{scheme}:// stores are not supported by this version yet")
    raise StoreURLError(
        f"unsupported store URL {redact(url)!r}; use memory://, redis://HOST:PORT/DB, "
        "rediss://HOST:PORT/DB or unix:///path/to/redis.sock"
    )


def redact(url: str) -> str:
    """The URL without its password, for logs and start-up messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


__all__ = ["MemoryStore", "Store", "StoreError", "StoreURLError", "redact", "store_from_url"]
