"""Token window: a token rate's clock-aligned windows of model tokens (twin of
token_window.lua)."""

from __future__ import annotations

from ratewarden.limiter.algorithms import Check, Table, noop
from ratewarden.limiter.ops import CounterOp

TOKEN_CEILING = 10**15  # a window's count stays exact in a double (the script's numbers)


def tokens_in(table: Table, key: str, start: int, now: int) -> int:
    """The tokens counted in the window from `start` (the cell holds (start, count))."""
    stored = table.get(key, now)
    return int(stored[1]) if stored is not None and stored[0] == start else 0


def token_window(table: Table, op: CounterOp, now: int, call_id: str) -> Check:
    """Admits while the window holds fewer tokens than the limit; takes nothing: the
    call's settle adds its tokens (`token_window_add`)."""
    start = now - now % op.window_ms
    count = tokens_in(table, op.key, start, now)
    admitted = count < op.limit
    ends_in = start + op.window_ms - now
    retry = None if op.limit == 0 else (0 if admitted else ends_in)
    return Check(admitted, count, retry, ends_in if count else 0, noop)


def token_window_add(table: Table, key: str, window_ms: int, tokens: int, now: int) -> None:
    """The settle: add `tokens` to the current window (`window_ms` 0: the rule is gone)."""
    if window_ms <= 0 or tokens <= 0:
        return
    start = now - now % window_ms
    count = min(TOKEN_CEILING, tokens_in(table, key, start, now) + tokens)
    table.put(key, (start, count), start + window_ms - now, now)
