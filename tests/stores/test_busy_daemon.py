"""A busy daemon is not a broken store (issue 26, item 3).

Two real `ratewarden serve` processes share one healthy redis-server; a 5.00 budget
fits exactly 50 reservations of 0.10. 200 reservations are sent at once, half to each
daemon, while a thread of the test starves each daemon: it stops the daemon's process
group (SIGSTOP) for 150 ms, lets it run briefly, and stops it again, until every answer
is in. Redis answers each store call within a millisecond, but the daemon can read that
answer only when it runs again, long after its store timeout: a deadline that counted
the time the daemon was stopped would answer by the fail mode (open here), and each
such answer is a free call. Exactly 50 must be admitted and none `degraded`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.daemon import Daemon, running_daemon
from tests.helpers.redis_server import RedisServer, running_redis
from tests.stores.test_budget_race_redis import BUDGET_KEY, COST_MICROS, FITS, race_policy

pytestmark = pytest.mark.redis

CALLS = 200
STOPPED_S = 0.15  # each burst the daemon is stopped for: past the 100 ms store timeout
RUNNING_S = 0.05  # ... and between bursts, it runs for this long
ANSWERED_IN_S = 60.0  # every answer, however starved the daemons (no speed claim)


class Starver:
    """Stops and continues each daemon's process group in bursts, from a thread, until
    told to stop; each daemon's bursts out of step with the other's."""

    def __init__(self, daemons: list[Daemon]) -> None:
        self._groups = [os.getpgid(d.process.pid) for d in daemons]
        self._done = threading.Event()
        self._threads = [
            threading.Thread(target=self._starve, args=(group, n * RUNNING_S / 2), daemon=True)
            for n, group in enumerate(self._groups)
        ]
        self.bursts = 0

    def _starve(self, group: int, offset_s: float) -> None:
        time.sleep(offset_s)
        while not self._done.is_set():
            os.killpg(group, signal.SIGSTOP)
            try:
                time.sleep(STOPPED_S)
            finally:
                os.killpg(group, signal.SIGCONT)
            self.bursts += 1
            time.sleep(RUNNING_S)

    @contextlib.contextmanager
    def starving(self) -> Iterator[Starver]:
        for thread in self._threads:
            thread.start()
        try:
            yield self
        finally:
            self._done.set()
            for thread in self._threads:
                thread.join(timeout=10)
            for group in self._groups:  # whatever happened, never leave one stopped
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGCONT)


async def reserve_all(urls: list[str]) -> list[dict[str, Any]]:
    """CALLS reservations of 0.10 by one user, all at once, alternating between `urls`."""
    limits = httpx.Limits(max_connections=CALLS, max_keepalive_connections=CALLS)
    timeout = httpx.Timeout(ANSWERED_IN_S)
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as http:

        async def reserve(n: int) -> dict[str, Any]:
            body = {"user": "alice", "tool": "terminal", "call_id": f"c{n}", "cost": 0.1}
            response = await http.post(f"{urls[n % len(urls)]}/v1/check", json=body)
            assert response.status_code == 200, response.text
            found: dict[str, Any] = response.json()
            return found

        return await asyncio.gather(*(reserve(n) for n in range(CALLS)))


@contextlib.contextmanager
def two_daemons(tmp_path: Path) -> Iterator[tuple[RedisServer, list[Daemon]]]:
    with running_redis(tmp_path / "redis") as server:
        policy = tmp_path / "policy.yaml"
        policy.write_text(race_policy(server, ", fail: open"))
        flags = ("--policy", str(policy), "--store-url", server.url)
        with (
            running_daemon(tmp_path, *flags) as one,
            running_daemon(tmp_path, *flags) as two,
        ):
            yield server, [one, two]


def test_a_starved_daemon_waits_for_redis_instead_of_giving_money_away(tmp_path: Path) -> None:
    with two_daemons(tmp_path) as (server, daemons):
        starver = Starver(daemons)
        with starver.starving():
            answers = asyncio.run(reserve_all([d.url for d in daemons]))
        outcomes = Counter(a["decision"] + (" degraded" if a["degraded"] else "") for a in answers)
        with server.client() as client:
            spent, reserved = client.hmget(BUDGET_KEY, ["s", "r"])
        logs = "".join(d.log_text() for d in daemons)
    assert starver.bursts >= 4, starver.bursts  # the daemons were starved all along
    assert outcomes == {"allow": FITS, "deny": CALLS - FITS}, (outcomes, logs[-3000:])
    assert (int(spent or 0), int(reserved or 0)) == (0, FITS * COST_MICROS)
