"""The fleet (issue 26, items 1 and 2): a reset, an override and a reload through one
process reach every worker of every daemon on the store within the poll; the console's
overview and the admin API show the sum of every live process, each one listed.

Two daemons of two workers each on one real Redis: four processes. Each request goes on
a fresh connection, so the kernel hands it to either worker of its daemon."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ratewarden.clock import FakeClock
from ratewarden.service.console import SAMPLE_INTERVAL_S
from ratewarden.store import MemoryStore
from tests.helpers.app import build_app, serving
from tests.helpers.daemon import Daemon, clean_environment, running_daemon
from tests.helpers.redis_server import running_redis

ADMIN, CHECK = "admin-token-0123456789", "check-token-0123456789"
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}
AS_CHECK = {"Authorization": f"Bearer {CHECK}"}
LIMIT = 20  # per minute: room for the checks sent after a change, none before it
POLICY = f"""\
version: 1
rules:
  - name: terminal-per-minute
    match: {{tool: terminal}}
    per: [user]
    rate: {LIMIT}/minute
  - name: banned
    match: {{tool: rm}}
    rate: 0/minute
"""
# What a change must reach every process within: a poll (1 s) plus a compile, at most 3 s.
BOUND_S = 3.0
WORKERS_START_S = 30.0  # two daemons of two workers to fork and answer, on a busy machine
SPREAD = 30  # fresh connections per daemon: each worker gets some (all on one: 2**-29)


@contextlib.contextmanager
def two_daemons_of_two_workers(tmp_path: Path) -> Iterator[tuple[Daemon, Daemon, Path]]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    env = clean_environment(
        RATEWARDEN_API_TOKENS=CHECK,
        RATEWARDEN_ADMIN_TOKENS=ADMIN,
        RATEWARDEN_WORKERS="2",
        RATEWARDEN_RELOAD_INTERVAL_S="0",  # no watcher: a reload reaches others by the fleet
    )
    with running_redis(tmp_path) as redis:
        env["RATEWARDEN_STORE_URL"] = redis.url
        flags = ("--policy", str(policy))
        with (
            running_daemon(tmp_path, *flags, env=env) as one,
            running_daemon(tmp_path, *flags, env=env) as two,
        ):
            for daemon in (one, two):

                def both_workers_ready(d: Daemon = daemon) -> bool:
                    return d.log_text().count(" ready on ") == 2

                eventually(both_workers_ready, WORKERS_START_S)
            yield one, two, policy


def eventually(condition: Callable[[], bool], within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {within_s} s"
        time.sleep(0.05)  # bounded polling of real processes


def fresh(method: str, url: str, body: dict[str, Any] | None = None) -> httpx.Response:
    """One request on a connection of its own, so either worker of the daemon answers."""
    headers = AS_CHECK if "/v1/check" in url else AS_ADMIN
    with httpx.Client(trust_env=False, timeout=10.0) as http:
        return http.request(method, url, json=body, headers=headers)


def checks(daemon: Daemon, user: str, times: int, tool: str = "terminal") -> list[bool]:
    body = {"user": user, "tool": tool}
    return [fresh("POST", f"{daemon.url}/v1/check", body).json()["allowed"] for _ in range(times)]


def exhaust_everywhere(one: Daemon, two: Daemon, user: str) -> None:
    """Use up `user`'s limit, then have every worker of both daemons refuse and remember."""
    assert all(checks(one, user, LIMIT))
    for daemon in (one, two):
        assert not any(checks(daemon, user, SPREAD))


def all_allowed_after_the_bound(one: Daemon, two: Daemon, user: str) -> None:
    time.sleep(BOUND_S)  # the bound itself: what the change must reach every process within
    answers = [a for _ in range(4) for daemon in (one, two) for a in checks(daemon, user, 2)]
    assert answers == [True] * 16


@pytest.mark.redis
@pytest.mark.slow
def test_a_reset_through_one_process_reaches_every_worker_of_every_daemon(
    tmp_path: Path,
) -> None:
    with two_daemons_of_two_workers(tmp_path) as (one, two, _):
        exhaust_everywhere(one, two, "alice")
        reset = fresh("POST", f"{one.url}/v1/admin/reset", {"user": "alice"})
        assert reset.status_code == 200, reset.text
        all_allowed_after_the_bound(one, two, "alice")


@pytest.mark.redis
@pytest.mark.slow
def test_an_override_through_one_process_reaches_every_worker_of_every_daemon(
    tmp_path: Path,
) -> None:
    with two_daemons_of_two_workers(tmp_path) as (one, two, _):
        exhaust_everywhere(one, two, "bob")
        grant = {"users": ["bob"], "rule": "terminal-per-minute", "rate": "100/minute",
                 "reason": "issue 26"}  # fmt: skip
        made = fresh("POST", f"{one.url}/v1/admin/overrides", grant)
        assert made.status_code == 201, made.text
        all_allowed_after_the_bound(one, two, "bob")


@pytest.mark.redis
@pytest.mark.slow
def test_a_reload_through_one_process_reaches_every_worker_of_every_daemon(
    tmp_path: Path,
) -> None:
    with two_daemons_of_two_workers(tmp_path) as (one, two, policy):
        exhaust_everywhere(one, two, "carol")
        policy.write_text(POLICY.replace(f"rate: {LIMIT}/minute", "rate: 100/minute"))
        reloaded = fresh("POST", f"{one.url}/v1/admin/reload")
        assert reloaded.status_code == 200, reloaded.text
        all_allowed_after_the_bound(one, two, "carol")

        def every_process_names_the_new_version() -> bool:
            found = fresh("GET", f"{two.url}/v1/admin/stats").json()["processes"]
            versions = {p["policy"]["version"] for p in found}
            return len(found) == 4 and versions == {reloaded.json()["version"]}

        eventually(every_process_names_the_new_version, BOUND_S)  # its report, at its poll
        stats = fresh("GET", f"{two.url}/v1/admin/stats").json()
        assert all(p["last_reload"]["ok"] for p in stats["processes"])


@pytest.mark.redis
@pytest.mark.slow
def test_the_overview_from_any_process_is_the_sum_of_every_process(tmp_path: Path) -> None:
    allowed, denied = 24, 12
    with two_daemons_of_two_workers(tmp_path) as (one, two, _):
        for n in range(allowed // 2):
            for daemon in (one, two):
                assert checks(daemon, f"u{n}", 1) == [True]
        for daemon in (one, two):
            assert checks(daemon, "dave", denied // 2, tool="rm") == [False] * (denied // 2)

        def overview(daemon: Daemon) -> dict[str, Any]:
            found = fresh("GET", f"{daemon.url}/v1/admin/stats")
            assert found.status_code == 200, found.text
            stats: dict[str, Any] = found.json()
            return stats

        whole_from: set[int] = set()

        def every_report_whole() -> bool:
            """An overview sums the answering worker's figures, read now, and the others'
            reports: whole from two workers, every report in the store is whole."""
            for daemon in (one, two):
                stats = overview(daemon)
                if stats["totals"]["decisions"] == allowed + denied:
                    whole_from.add(stats["pid"])
            return len(whole_from) >= 2

        # A report's figures are read at its sampler's next reading, sent at the next poll.
        eventually(every_report_whole, SAMPLE_INTERVAL_S + BOUND_S)
        for _ in range(4):  # from either worker of either daemon
            for daemon in (one, two):
                stats = overview(daemon)
                assert stats["processes_error"] is None
                totals = stats["totals"]
                assert (totals["decisions"], totals["allowed"], totals["denied"]) == (
                    allowed + denied,
                    allowed,
                    denied,
                )
                assert totals["denial_ratio"] == round(denied / (allowed + denied), 4)
                assert sum(m["decisions"] for m in stats["minutes"]) == allowed + denied
                assert stats["top_rules"] == [{"name": "banned", "refusals": denied}]
                assert stats["top_tools"] == [{"name": "rm", "refusals": denied}]
                processes = stats["processes"]
                assert len(processes) == 4
                assert sum(p["totals"]["decisions"] for p in processes) == allowed + denied
                daemons = {p["daemon"] for p in processes}
                assert {d.rpartition(":")[2] for d in daemons} == {str(one.port), str(two.port)}
                assert len({p["pid"] for p in processes}) == 4
        # The console's recent refusals are the store's list, whichever daemon took them.
        for daemon in (one, two):
            denials = fresh("GET", f"{daemon.url}/v1/denials?user=dave").json()["denials"]
            assert len(denials) == denied

        two.process.terminate()  # its workers stop reporting: they drop out
        two.process.wait(timeout=15)

        def only_one_daemon_left() -> bool:
            processes = overview(one)["processes"]
            return {p["daemon"].rpartition(":")[2] for p in processes} == {str(one.port)}

        eventually(only_one_daemon_left, 5.0 + BOUND_S)


# -- in one process, the fleet's parts on the embedded store (fast) --------------------


def make_app(store: MemoryStore) -> Any:
    return build_app(POLICY, store, api_tokens=[CHECK], admin_tokens=[ADMIN])


async def allowed(client: httpx.AsyncClient, user: str, times: int) -> list[bool]:
    answers = []
    for _ in range(times):
        found = await client.post(
            "/v1/check", json={"user": user, "tool": "terminal"}, headers=AS_CHECK
        )
        answers.append(found.json()["allowed"])
    return answers


async def test_a_peer_forgets_its_refusals_at_its_poll_after_a_reset() -> None:
    store = MemoryStore(FakeClock())
    taker, peer = make_app(store), make_app(store)
    async with serving(taker) as one, serving(peer) as two:
        assert await allowed(one, "erin", LIMIT) == [True] * LIMIT
        assert await allowed(two, "erin", 2) == [False, False]
        assert len(peer.state.engine.refusals) == 1  # remembered
        reset = await one.post("/v1/admin/reset", json={"user": "erin"}, headers=AS_ADMIN)
        assert reset.status_code == 200
        await peer.state.fleet.poll()  # what the poller does every second
        assert len(peer.state.engine.refusals) == 0
        assert await allowed(two, "erin", 2) == [True, True]


async def test_the_process_that_reset_does_not_follow_its_own_announcement() -> None:
    store = MemoryStore(FakeClock())
    taker = make_app(store)
    async with serving(taker) as one:
        fleet = taker.state.fleet
        before = dict(fleet.seen)
        await one.post("/v1/admin/reset", json={"user": "erin"}, headers=AS_ADMIN)
        assert fleet.seen["reset"] == before.get("reset", 0) + 1  # noted, nothing to follow
