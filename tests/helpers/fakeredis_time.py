"""fakeredis on the test's clock.

fakeredis expires keys by the wall clock (it reads `time.time()` before each command),
while the scripts count on the FakeClock the store is given. A key whose TTL is a few
milliseconds of fake time then lived or expired by how fast the machine ran the test: a
conformance test compared with the memory store failed under load (a fixed window's key
gone before its window ended, its calls allowed again). Following the FakeClock,
fakeredis expires a key when the scripts' own time says it should, as the memory store
does and as a real Redis does under the real clock.
"""

from __future__ import annotations

import pytest
from fakeredis._socket import _base

from ratewarden.clock import FakeClock


class _ClockTime:
    """The part of the `time` module fakeredis's sockets read: `time()`, from `clock`."""

    def __init__(self, clock: FakeClock) -> None:
        self._clock = clock

    def time(self) -> float:
        return self._clock.now_ms() / 1000


def follow(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> None:
    """Make every fakeredis server read its time from `clock` until the test ends."""
    assert hasattr(_base, "time"), "fakeredis no longer reads time where this expects"
    monkeypatch.setattr(_base, "time", _ClockTime(clock))
