"""Calendar budget periods in a timezone, across DST changes and month/week boundaries."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratewarden.policy.periods import PERIODS, PeriodClock, bounds


def ms(iso: str) -> int:
    return int(datetime.fromisoformat(iso).timestamp() * 1000)


def local(value: int, tz: str) -> str:
    return datetime.fromtimestamp(value / 1000, ZoneInfo(tz)).isoformat()


@pytest.mark.parametrize(
    ("period", "tz", "now", "start", "end", "hours"),
    [
        # Spring forward: the Berlin day of 29 March 2026 has 23 hours.
        ("day", "Europe/Berlin", "2026-03-29T12:00:00+02:00", "2026-03-29T00:00:00+01:00",
         "2026-03-30T00:00:00+02:00", 23),
        # Fall back: 25 October 2026 has 25 hours; 01:30 is still that day.
        ("day", "Europe/Berlin", "2026-10-25T01:30:00+02:00", "2026-10-25T00:00:00+02:00",
         "2026-10-26T00:00:00+01:00", 25),
        # A New York week across the November DST change: Monday to Monday, 169 hours.
        ("week", "America/New_York", "2026-11-01T12:00:00-05:00", "2026-10-26T00:00:00-04:00",
         "2026-11-02T00:00:00-05:00", 169),
        # December rolls over into the next year.
        ("month", "Europe/Berlin", "2026-12-31T23:30:00+01:00", "2026-12-01T00:00:00+01:00",
         "2027-01-01T00:00:00+01:00", 744),
        # March in Berlin loses an hour to DST.
        ("month", "Europe/Berlin", "2026-03-15T00:00:00+01:00", "2026-03-01T00:00:00+01:00",
         "2026-04-01T00:00:00+02:00", 743),
        # Half-hour offsets: Kolkata hours are not UTC hours.
        ("hour", "Asia/Kolkata", "2026-03-15T00:45:00+05:30", "2026-03-15T00:00:00+05:30",
         "2026-03-15T01:00:00+05:30", 1),
        # The repeated hour at fall-back is its own hour.
        ("hour", "Europe/Berlin", "2026-10-25T02:30:00+01:00", "2026-10-25T02:00:00+01:00",
         "2026-10-25T03:00:00+01:00", 1),
        # Midnight itself belongs to the new day, in the policy's zone, not UTC's.
        ("day", "America/Los_Angeles", "2026-07-01T00:00:00-07:00", "2026-07-01T00:00:00-07:00",
         "2026-07-02T00:00:00-07:00", 24),
    ],
)  # fmt: skip
def test_calendar_bounds(period: str, tz: str, now: str, start: str, end: str, hours: int) -> None:
    found = bounds(period, ZoneInfo(tz), ms(now))
    assert (local(found.start, tz), local(found.end, tz)) == (start, end)
    assert (found.end - found.start) == hours * 3_600_000


@given(
    period=st.sampled_from(PERIODS),
    tz=st.sampled_from(
        ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kolkata"]
    ),
    now=st.integers(
        min_value=ms("2020-01-01T00:00:00+00:00"), max_value=ms("2035-01-01T00:00:00+00:00")
    ),
)
def test_periods_tile_time(period: str, tz: str, now: int) -> None:
    """Every instant is in exactly one period, and consecutive periods meet without gaps."""
    zone = ZoneInfo(tz)
    found = bounds(period, zone, now)
    assert found.start <= now < found.end < found.next_end
    assert bounds(period, zone, found.end).start == found.end
    assert bounds(period, zone, found.end).end == found.next_end
    assert bounds(period, zone, found.start) == found
    assert bounds(period, zone, found.end - 1).start == found.start


def test_period_clock_follows_time() -> None:
    clock = PeriodClock("day", ZoneInfo("Europe/Berlin"))
    first = clock.at(ms("2026-03-28T23:59:59+01:00"))
    second = clock.at(ms("2026-03-29T00:00:00+01:00"))
    assert second.start == first.end
    assert clock.at(ms("2026-03-28T10:00:00+01:00")) == first
