"""Calendar periods for budgets: the hour, day, week or month containing an instant,
in the policy's timezone. DST is handled by doing the arithmetic on local wall-clock
dates and converting each boundary to UTC, so a day can be 23 or 25 hours long.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

PERIODS = ("hour", "day", "week", "month")


@dataclass(frozen=True, slots=True)
class Bounds:
    """One period [start, end) and the end of the next one, in ms since the epoch."""

    start: int
    end: int
    next_end: int

    def contains(self, now_ms: int) -> bool:
        return self.start <= now_ms < self.end


def bounds(period: str, tz: ZoneInfo, now_ms: int) -> Bounds:
    """The period containing `now_ms`, and the end of the one after it."""
    local = datetime.fromtimestamp(now_ms / 1000, tz)
    start = _floor(period, local)
    end = _advance(period, start)
    return Bounds(_ms(start), _ms(end), _ms(_advance(period, end)))


class PeriodClock:
    """Remembers the current period so the hot path recomputes it once per period."""

    def __init__(self, period: str, tz: ZoneInfo) -> None:
        self.period, self.tz = period, tz
        self._current = bounds(period, tz, 0)

    def at(self, now_ms: int) -> Bounds:
        if not self._current.contains(now_ms):
            self._current = bounds(self.period, self.tz, now_ms)
        return self._current


def _floor(period: str, local: datetime) -> datetime:
    naive = local.replace(tzinfo=None)
    if period == "hour":
        start = naive.replace(minute=0, second=0, microsecond=0)
    else:
        start = naive.replace(hour=0, minute=0, second=0, microsecond=0)
        if period == "week":
            start -= timedelta(days=start.weekday())  # weeks start on Monday (ISO 8601)
        elif period == "month":
            start = start.replace(day=1)
    return start.replace(tzinfo=local.tzinfo)


def _advance(period: str, start: datetime) -> datetime:
    """The next boundary, on the local calendar (wall clock), whatever DST does."""
    naive = start.replace(tzinfo=None)
    if period == "hour":
        # Hours are counted in absolute time: a DST change must not make one 2 h long.
        return datetime.fromtimestamp(start.timestamp() + 3600, start.tzinfo)
    if period == "day":
        naive += timedelta(days=1)
    elif period == "week":
        naive += timedelta(days=7)
    else:
        naive = naive.replace(year=naive.year + naive.month // 12, month=naive.month % 12 + 1)
    return naive.replace(tzinfo=start.tzinfo)


def _ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)
