"""`redis+sentinel://` on a real master, replica and two sentinels (free ports).

- The conformance table of tests/conformance/test_conformance.py, unchanged, through the sentinels.
- Failover, with the real daemon (`ratewarden serve --store-url redis+sentinel://...`):
  `SENTINEL FAILOVER`, and the master killed. The daemon answers every check within its
  store deadline throughout (degraded, by the fail mode, while there is no master), then
  decides on the new master with the counters, budgets and call records replicated from
  the old one.
- The URL: several sentinels (a dead one is skipped), service and db, credentials.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ratewarden.calls import Call
from ratewarden.clock import FakeClock
from ratewarden.engine import Engine
from ratewarden.limiter.ops import Kind
from ratewarden.policy import parse_policy
from ratewarden.store import redact, store_from_url
from ratewarden.store.keys import counter_key
from ratewarden.store.sentinel import SentinelStore
from tests.conformance import test_conformance as conformance
from tests.helpers.hostenv import running_daemon
from tests.helpers.redis_cluster import (
    SERVICE,
    SentinelDeployment,
    role,
    running_sentinel,
    store_tests,
    wait_for,
)
from tests.helpers.redis_server import RedisServer, free_port

pytestmark = pytest.mark.redis


@pytest.fixture(scope="module")
def sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelDeployment]:
    with running_sentinel(tmp_path_factory.mktemp("sentinel")) as deployment:
        yield deployment


@pytest.fixture
async def sentinel_store(
    sentinel: SentinelDeployment, clock: FakeClock
) -> AsyncIterator[SentinelStore]:
    sentinel.flush()
    store = store_from_url(sentinel.url, timeout_ms=2_000, clock=clock)
    assert isinstance(store, SentinelStore)
    await store.start()
    yield store
    await store.close()


@pytest.mark.parametrize("scenario", conformance.SCENARIOS, ids=lambda s: s.name)
async def test_conformance_scenario_through_sentinel(
    scenario: conformance.Scenario, sentinel_store: SentinelStore, clock: FakeClock
) -> None:
    await conformance.test_scenario(scenario, sentinel_store, clock)


async def test_decisions_land_on_the_master_and_replicate(
    sentinel: SentinelDeployment, sentinel_store: SentinelStore, clock: FakeClock
) -> None:
    engine = Engine(
        parse_policy(b"version: 1\nrules:\n  - {name: r, rate: 2/minute}\n"), sentinel_store
    )
    assert (await engine.check(Call("alice", "terminal", "c1"))).allowed
    key = counter_key("r", Kind.SLIDING_WINDOW, [("user", "alice")])
    master, replica = sentinel.current_master(), sentinel.replica
    if replica is master:
        replica = sentinel.master
    client = master.client()
    assert client.exists(key)
    assert client.execute_command("WAIT", 1, 2_000) == 1  # type: ignore[no-untyped-call]
    client.close()
    client = replica.client()
    assert client.get(key) is not None  # the replica a failover would promote has it
    client.close()
    assert await sentinel_store.master_address() == ("127.0.0.1", master.port)


async def test_a_dead_sentinel_in_the_list_is_skipped(
    sentinel: SentinelDeployment, clock: FakeClock
) -> None:
    sentinel.flush()
    live = ",".join(f"127.0.0.1:{s.port}" for s in sentinel.sentinels)
    url = f"redis+sentinel://127.0.0.1:{free_port()},{live}/{SERVICE}/0"
    store = store_from_url(url, timeout_ms=1_000, clock=clock)
    try:
        await store.start()
        engine = Engine(parse_policy(b"version: 1\nrules:\n  - {name: r, rate: 1/minute}\n"), store)
        started = time.monotonic()
        decisions = [(await engine.check(Call("u", "t", str(i)))).decision for i in range(2)]
        assert decisions == ["allow", "deny"]
        # No retries on the dead sentinel: well within a store deadline of this order.
        assert time.monotonic() - started < 0.5
    finally:
        await store.close()


async def test_the_url_names_service_db_and_credentials() -> None:
    url = "redis+sentinel://me:s%40cret@127.0.0.1:1,[::1]:2/other-master/3?sentinel_password=x"
    store = store_from_url(url, timeout_ms=250)
    assert isinstance(store, SentinelStore)
    try:
        assert store.service == "other-master"
        pool = store._client.connection_pool
        assert pool.connection_kwargs["db"] == 3
        assert pool.connection_kwargs["username"] == "me"
        assert pool.connection_kwargs["password"] == "s@cret"
        assert pool.connection_kwargs["socket_timeout"] == 0.25
        hosts = [
            (
                c.connection_pool.connection_kwargs["host"],
                c.connection_pool.connection_kwargs["port"],
            )
            for c in store.sentinel.sentinels
        ]
        assert hosts == [("127.0.0.1", 1), ("::1", 2)]
        kwargs = store.sentinel.sentinels[0].connection_pool.connection_kwargs
        assert (kwargs["password"], kwargs["socket_connect_timeout"]) == ("x", 0.25)
        assert "cret" not in store.description
        assert "sentinel_password=***" in store.description
        assert redact(url) == store.description
    finally:
        await store.close()
    defaults = store_from_url("redis+sentinel://sentinel.example/mymaster")
    assert isinstance(defaults, SentinelStore)
    sentinels = defaults.sentinel.sentinels
    assert sentinels[0].connection_pool.connection_kwargs["port"] == 26379
    assert defaults._client.connection_pool.connection_kwargs["db"] == 0
    await defaults.close()


# ------------------------------------------------------------------------------ failover

POLICY = """\
version: 1
rules:
  - {name: per-minute, match: {tool: terminal}, rate: 5/minute}
  - {name: spend, match: {tool: terminal}, budget: 100.00/day}
  - {name: probes, match: {tool: probe}, rate: 1000/minute}
"""
DEADLINE_MS = 250


class Prober:
    """Checks a fresh user every 20 ms from a thread, timing each answer."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http
        self.answers: list[tuple[int, dict[str, Any], float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            started = time.monotonic()
            response = self.http.post(
                "/v1/check", json={"user": f"probe-{n}", "tool": "probe", "call_id": f"p{n}"}
            )
            assert response.status_code == 200, response.text
            self.answers.append((n, response.json(), time.monotonic() - started))
            n += 1
            time.sleep(0.02)

    def __enter__(self) -> Prober:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def next_number(self) -> int:
        return len(self.answers)


def probe_key(n: int) -> str:
    return counter_key("probes", Kind.SLIDING_WINDOW, [("user", f"probe-{n}")])


def written_on(server: RedisServer, since: int, upto: int) -> bool:
    """Some probe numbered in [since, upto) left its counter on `server`."""
    client = server.client()
    try:
        return any(client.exists(probe_key(n)) for n in range(since, upto))
    finally:
        client.close()


def fail_over(
    deployment: SentinelDeployment, how: str, old: RedisServer, new: RedisServer, prober: Prober
) -> None:
    """Make `new` the master (`how`), and wait until the daemon decides on it."""
    time.sleep(0.2)
    if how == "master-killed":
        old.process.kill()
        old.process.wait()
    else:
        client = deployment.sentinels[0].client()
        client.execute_command("SENTINEL", "FAILOVER", SERVICE)  # type: ignore[no-untyped-call]
        client.close()
    wait_for("the sentinels to name the new master", lambda: deployment.master_port() == new.port)
    wait_for("the new master to take writes", lambda: role(new) == "master")
    switched, since = prober.next_number(), time.monotonic()  # probes from here may land there
    wait_for(
        "the daemon to decide on the new master",
        lambda: written_on(new, switched, prober.next_number()),
        timeout=15,
    )
    # The store asks the sentinels every second: it follows the master well before the
    # old one is demoted (up to 10 s after `SENTINEL FAILOVER`, when a sentinel polls it).
    assert time.monotonic() - since < 4
    time.sleep(0.2)


@pytest.mark.parametrize("how", ["sentinel-failover", "master-killed"])
@pytest.mark.slow
def test_the_daemon_keeps_deciding_across_a_failover(tmp_path: Path, how: str) -> None:
    with contextlib.ExitStack() as stack:
        deployment = stack.enter_context(running_sentinel(tmp_path / "redis"))
        daemon = stack.enter_context(
            running_daemon(
                POLICY,
                tmp_path / "daemon",
                *("--store-url", deployment.url, "--store-timeout-ms", str(DEADLINE_MS)),
                *("--fail", "open", "--log-level", "warning"),
            )
        )
        http = stack.enter_context(httpx.Client(base_url=daemon.url, trust_env=False, timeout=10))

        def check(call_id: str, **extra: Any) -> dict[str, Any]:
            body = {"user": "alice", "tool": "terminal", "call_id": call_id, "cost": 1.0}
            response = http.post("/v1/check", json={**body, **extra})
            assert response.status_code == 200, response.text
            found: dict[str, Any] = response.json()
            return found

        def remaining(answer: dict[str, Any]) -> dict[str, float]:
            return {limit["rule"]: limit["remaining"] for limit in answer["limits"]}

        for i in range(3):
            answer = check(f"a{i}")
            assert (answer["decision"], answer["degraded"]) == ("allow", False)
            assert remaining(answer) == {"per-minute": 4 - i, "spend": 99 - i}
        old = deployment.current_master()
        new = deployment.replica
        client = old.client()
        assert client.execute_command("WAIT", 1, 2_000) == 1  # type: ignore[no-untyped-call]  # replicated first
        client.close()

        with Prober(http) as prober:
            fail_over(deployment, how, old, new, prober)

        # Every check was answered, within the deadline (plus HTTP), by the fail mode
        # (open: allow, degraded) while no master answered.
        assert prober.answers
        slow = [(n, t) for n, _, t in prober.answers if t > 2.0]
        assert not slow, slow
        assert {a["decision"] for _, a, _ in prober.answers} == {"allow"}
        degraded = sum(a["degraded"] for _, a, _ in prober.answers)
        if how == "master-killed":
            assert degraded > 0  # there was a moment without a master, and it was answered
        assert not prober.answers[-1][1]["degraded"]

        # The counters, reservations and call records came across with the replica.
        assert remaining(check("a3")) == {"per-minute": 1, "spend": 96}
        replay = check("a0")
        assert replay["replayed"] is True
        settled = http.post("/v1/calls/a0/settle", json={"cost": 0.5})
        assert settled.status_code == 200, settled.text
        assert settled.json()["outcome"] == "settled"
        last = check("a4")
        assert (last["decision"], remaining(last)) == ("allow", {"per-minute": 0, "spend": 95.5})
        refused = check("a5")
        assert refused["decision"] == "deny"
        assert refused["message"].startswith("Rate limit: max 5 terminal calls per minute")
        assert not refused["degraded"]
        # ... and they live on the new master now.
        client = new.client()
        assert client.exists(counter_key("per-minute", Kind.SLIDING_WINDOW, [("user", "alice")]))
        client.close()


# ------------------------------------------------ the store-based suites, through Sentinel


@pytest.fixture
async def store(sentinel_store: SentinelStore) -> SentinelStore:
    """Overrides conftest's `store` for this module: the suites below run through Sentinel."""
    return sentinel_store


globals().update(store_tests("sentinel"))
