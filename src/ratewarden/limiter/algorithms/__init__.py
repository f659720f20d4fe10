"""The counters' algorithms in pure Python, one module per algorithm beside its Lua twin.

Each algorithm looks at a counter without changing it and yields a `Check`; its `commit`
applies the call, and `decide` (reference.py) commits only if the whole call is allowed.
A pair (`budget.py`, `budget.lua`) has the same names and shape, so a change to one shows
as a diff that touches the other file of the pair.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


class Table(Protocol):
    """Key/value cells with expiry, as Redis keys behave."""

    # Days a budget's spend record lives past its day (0: none kept); the script's
    # SPEND_RETENTION_DAYS (limiter/script.py).
    spend_retention_days: int

    def get(self, key: str, now_ms: int) -> Any: ...

    def put(self, key: str, value: Any, ttl_ms: int, now_ms: int) -> None: ...

    def ttl(self, key: str, now_ms: int) -> int: ...

    def delete(self, key: str) -> None: ...


@dataclass(slots=True)
class Check:
    admitted: bool
    used: int
    retry_ms: int | None
    reset_ms: int
    commit: Callable[[], None]
    reserved: int = 0
    save: Callable[[], None] | None = None  # budgets write back their bookkeeping


def noop() -> None:
    return None
