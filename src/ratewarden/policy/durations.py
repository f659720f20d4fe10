"""Parse the policy's rate syntax: `10/minute`, `100/5m`, `5/10 minutes`, and token
rates: `200000 tokens/minute`."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from decimal import Decimal

_UNIT_MS = {
    "second": 1_000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": 86_400_000,
}
_UNIT_ALIASES = {
    "s": "second", "sec": "second", "secs": "second", "second": "second", "seconds": "second",
    "m": "minute", "min": "minute", "mins": "minute", "minute": "minute", "minutes": "minute",
    "h": "hour", "hr": "hour", "hrs": "hour", "hour": "hour", "hours": "hour",
    "d": "day", "day": "day", "days": "day",
}  # fmt: skip
_RATE = re.compile(r"^\s*(\d+)\s*(tokens?\s*)?/\s*(\d+)?\s*([a-z]+)\s*$")

# Longest window a rate rule may use; longer periods are what budgets are for.
MAX_WINDOW_MS = 31 * _UNIT_MS["day"]


@dataclass(frozen=True, slots=True)
class Rate:
    """`limit` calls (or, with `tokens`, model tokens) per `window_ms`; `window` is the
    human name used in messages."""

    limit: int
    window_ms: int
    window: str
    tokens: bool = False  # a token rate: model calls' tokens, added at their settle

    def __str__(self) -> str:
        return f"{self.limit}{' tokens' if self.tokens else ''}/{self.window}"


def parse_rate(text: object) -> Rate:
    """Parse `N/unit`, `N/Kunit` or `N/K units`, each with `tokens` after N for a token
    rate; raise ValueError naming what was expected."""
    expected = f'expected "N/window" (e.g. "10/minute", "5/10 minutes"), got {text!r}'
    if not isinstance(text, str):
        raise ValueError(expected)
    found = _RATE.match(text.lower())
    if not found:
        raise ValueError(expected)
    limit, tokens, count_text, unit_text = found.groups()
    unit = _UNIT_ALIASES.get(unit_text)
    if unit is None:
        raise ValueError(
            f"unknown time unit {unit_text!r} in {text!r}; use second, minute, hour or day"
        )
    count = int(count_text) if count_text else 1
    if count < 1:
        raise ValueError(f"the window in {text!r} must be at least 1 {unit}")
    window_ms = count * _UNIT_MS[unit]
    if window_ms > MAX_WINDOW_MS:
        raise ValueError(f"the window in {text!r} is longer than 31 days; use a budget instead")
    return Rate(int(limit), window_ms, window_name(count, unit), tokens=tokens is not None)


_DURATION = re.compile(r"^\s*(\d+)\s*([a-z]+)\s*$")


def parse_duration(text: object) -> int:
    """`30s`, `10m`, `1h`, `2 days` -> milliseconds (at least one second)."""
    expected = f'expected a duration such as "30s", "10m" or "1h", got {text!r}'
    found = _DURATION.match(text.lower()) if isinstance(text, str) else None
    unit = _UNIT_ALIASES.get(found.group(2)) if found else None
    if found is None or unit is None or int(found.group(1)) < 1:
        raise ValueError(expected)
    return int(found.group(1)) * _UNIT_MS[unit]


MICROS = 1_000_000  # budgets and costs are counted in millionths, so sums are exact
# Amounts stay far below 2**53 millionths, where Lua's doubles stop counting exactly.
MAX_AMOUNT = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Budget:
    """`amount` (in micro-units of the currency, exact) per calendar `period`."""

    micros: int
    period: str

    @property
    def amount(self) -> float:
        return self.micros / MICROS

    def __str__(self) -> str:
        return f"{format_amount(self.micros)}/{self.period}"


_BUDGET = re.compile(r"^\s*(\d+(?:\.\d{1,6})?)\s*/\s*(hour|day|week|month)\s*$")


def parse_budget(text: object) -> Budget:
    """Parse `AMOUNT/hour|day|week|month`, e.g. `5.00/day`."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        text = str(text)
    found = _BUDGET.match(text.lower()) if isinstance(text, str) else None
    if not found:
        raise ValueError(
            'expected "AMOUNT/period" with period hour, day, week or month '
            f'(e.g. "5.00/day"), got {text!r}'
        )
    budget = Budget(to_micros(found.group(1)), found.group(2))
    if budget.micros > MAX_AMOUNT * MICROS:
        raise ValueError(f"a budget is at most {MAX_AMOUNT:,} per period, got {text!r}")
    return budget


@functools.lru_cache(maxsize=4096)  # a tool's cost is converted on each of its calls
def to_micros(amount: str | float) -> int:
    """An amount of money as an exact count of millionths."""
    return int((Decimal(str(amount)) * MICROS).to_integral_value())


def format_amount(micros: int) -> str:
    """`4.98`, `0.05`, `0.0125`: at least two decimals, more only when they matter."""
    text = f"{micros / MICROS:.6f}".rstrip("0")
    whole, _, fraction = text.partition(".")
    return f"{whole}.{fraction.ljust(2, '0')}"


def window_name(count: int, unit: str) -> str:
    """`minute` for one minute, `10 minutes` otherwise: the words used in messages."""
    return unit if count == 1 else f"{count} {unit}s"


def humanize_seconds(seconds: float) -> str:
    """Round up to whole seconds and print compactly: `12s`, `3m20s`, `2h5m`."""
    total = max(1, int(-(-seconds // 1)))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m{secs}s" if secs else f"{minutes}m"
    return f"{secs}s"
