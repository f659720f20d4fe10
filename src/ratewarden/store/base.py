"""The one interface every store implements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ratewarden.limiter.ops import CounterOp, OpResult


class StoreError(Exception):
    """The store could not answer (unreachable, timed out, or refused the command)."""


class Store(Protocol):
    """Evaluates a call's counter ops atomically: all are committed, or none."""

    @property
    def description(self) -> str:
        """Where the store is, without credentials; printed at start-up."""
        ...

    async def start(self) -> None:
        """Connect and prepare (load scripts); called once before the first call."""
        ...

    async def evaluate(self, ops: Sequence[CounterOp], dry_run: bool = False) -> list[OpResult]:
        """Decide `ops` together; with `dry_run`, report without consuming anything."""
        ...

    async def ping(self) -> None:
        """Raise StoreError unless the store answers."""
        ...

    async def close(self) -> None: ...
