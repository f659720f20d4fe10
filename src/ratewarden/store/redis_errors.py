"""Redis' and the network's errors, as the store's own (`StoreError`): shared by the
Redis stores (redis_store.py, cluster.py) and their activity log (redis_activity.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from redis.exceptions import RedisClusterException, RedisError

from ratewarden.store.base import StoreError

# What redis-py and the network raise (a cluster client adds its own): a StoreError to us.
REDIS_ERRORS = (RedisError, RedisClusterException, OSError)


@contextlib.contextmanager
def store_errors() -> Iterator[None]:
    """Raise Redis' and the network's errors as StoreError (the engine's fail mode)."""
    try:
        yield
    except REDIS_ERRORS as exc:
        raise store_error(exc) from exc


def store_error(exc: BaseException) -> StoreError:
    """What `store_errors` raises for `exc`, one of Redis' or the network's errors."""
    return StoreError(f"{type(exc).__name__}: {exc}")
