"""Store outages: the circuit breaker on a fake clock, the store timeout on stores that
hang, and fail open / fail closed (global and per rule) through the whole app.

The live-Redis tests at the end prove the timeout against redis-py itself: a server
that accepts connections and never answers, a Redis frozen mid-command (SIGSTOP), a
client configured to retry, and the script cache emptied under the daemon (NOSCRIPT).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from ratewarden.clock import FakeClock
from ratewarden.limiter.ops import CallRecord, CounterOp, Evaluation, Hold, Kind, Recorded, Role
from ratewarden.limiter.script import SettleStatus
from ratewarden.policy import parse_policy
from ratewarden.service.app import create_app
from ratewarden.service.settings import Settings
from ratewarden.store import MemoryStore, StoreError, store_from_url
from ratewarden.store.breaker import CircuitBreaker, CircuitOpenError, GuardedStore, State
from tests.helpers.app import serving
from tests.helpers.redis_server import free_port, running_redis
from tests.stores.test_chaos import redis_on_free_port

TIMEOUT_MS = 100
TIMEOUT_S = TIMEOUT_MS / 1000
# In-process (no sockets) a decision takes a few ms beyond the store's time. The margin
# is for the scheduler, not for ratewarden: on a 2-CPU CI machine running other suites
# in parallel, a coroutine that is due can wait 50-170 ms for the CPU (measured).
MARGIN_S = 0.15
# A refusal by an open circuit waits for nothing: the proof is that the store is not
# called at all; the typical (median) refusal must also take a few ms at most.
FAST_MEDIAN_S = 0.01


# -- the state machine, on a fake clock ----------------------------------------------------


class Ticker:
    """A monotonic clock in seconds that moves only when told to."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def breaker(
    ticker: Ticker, failures: int = 5, cooldown_s: float = 1.0, rand: float = 0.0
) -> tuple[CircuitBreaker, list[tuple[State, State]]]:
    changes: list[tuple[State, State]] = []
    found = CircuitBreaker(
        failures,
        cooldown_s,
        now=ticker,
        rand=lambda: rand,
        on_change=lambda old, new: changes.append((old, new)),
    )
    return found, changes


def fail(b: CircuitBreaker, n: int = 1) -> None:
    for _ in range(n):
        b.failed(b.admit(), StoreError("ConnectionError: refused"))


def test_the_circuit_opens_after_n_consecutive_failures_only() -> None:
    ticker = Ticker()
    b, changes = breaker(ticker)
    fail(b, 4)
    b.succeeded(b.admit())  # a success resets the count
    fail(b, 4)
    assert (b.state, changes) == ("closed", [])
    fail(b)
    assert (b.state, changes) == ("open", [("closed", "open")])


def test_an_open_circuit_refuses_at_once_until_the_cool_down_ends() -> None:
    ticker = Ticker()
    b, changes = breaker(ticker, cooldown_s=1.0)
    fail(b, 5)
    for _ in range(100):
        with pytest.raises(CircuitOpenError) as refused:
            b.admit()
    assert isinstance(refused.value, StoreError)  # so the engine applies the fail mode
    message = str(refused.value)
    assert "circuit open: the store failed 5 times in a row" in message
    assert "ConnectionError: refused" in message
    assert "next try in 1.00s" in message
    ticker.now += 0.999
    with pytest.raises(CircuitOpenError):
        b.admit()
    ticker.now += 0.001
    assert b.admit() is True  # the probe
    assert changes == [("closed", "open"), ("open", "half_open")]


def test_half_open_lets_one_probe_through_and_its_success_closes_the_circuit() -> None:
    ticker = Ticker()
    b, changes = breaker(ticker)
    fail(b, 5)
    ticker.now += 1.0
    probe = b.admit()
    assert (probe, b.state) == (True, "half_open")
    with pytest.raises(CircuitOpenError, match="a probe is in flight"):
        b.admit()
    b.succeeded(probe)
    assert b.state == "closed"
    assert b.admit() is False  # ordinary calls again
    assert changes[-1] == ("half_open", "closed")
    # The count starts over: four failures do not reopen it.
    fail(b, 4)
    assert b.state == "closed"


def test_a_failed_probe_opens_the_circuit_for_another_cool_down() -> None:
    ticker = Ticker()
    b, changes = breaker(ticker)
    fail(b, 5)
    ticker.now += 1.0
    b.failed(b.admit(), StoreError("still down"))
    assert b.state == "open"
    with pytest.raises(CircuitOpenError, match=r"6 times in a row .*still down"):
        b.admit()
    ticker.now += 0.999
    with pytest.raises(CircuitOpenError):
        b.admit()
    ticker.now += 0.001
    assert b.admit() is True
    assert changes == [
        ("closed", "open"),
        ("open", "half_open"),
        ("half_open", "open"),
        ("open", "half_open"),
    ]


def test_cool_downs_are_jittered_up_to_20_percent() -> None:
    for rand, lasts in ((0.0, 1.0), (0.5, 1.1), (0.999, 1.1998)):
        ticker = Ticker()
        b, _ = breaker(ticker, rand=rand)
        fail(b, 5)
        ticker.now += lasts - 0.0005
        with pytest.raises(CircuitOpenError):
            b.admit()
        ticker.now += 0.001
        assert b.admit() is True, rand


def test_an_abandoned_probe_lets_the_next_call_probe() -> None:
    ticker = Ticker()
    b, _ = breaker(ticker)
    fail(b, 5)
    ticker.now += 1.0
    b.abandoned(b.admit())  # e.g. the client hung up mid-probe
    assert b.state == "half_open"
    assert b.admit() is True


def test_late_outcomes_of_calls_admitted_before_the_circuit_opened_change_nothing() -> None:
    ticker = Ticker()
    b, changes = breaker(ticker)
    early = [b.admit() for _ in range(7)]  # seven calls in flight when the store dies
    for probe in early[:5]:
        b.failed(probe, StoreError("down"))
    assert b.state == "open"
    b.failed(early[5], StoreError("down"))  # not counted against a future probe
    b.succeeded(early[6])  # a slow success of the past does not close it
    assert b.state == "open"
    assert changes == [("closed", "open")]
    with pytest.raises(CircuitOpenError, match="5 times in a row"):
        b.admit()


def test_failures_zero_turns_the_breaker_off() -> None:
    ticker = Ticker()
    b, changes = breaker(ticker, failures=0)
    fail(b, 1000)
    assert (b.state, changes, b.admit()) == ("closed", [], False)


def test_negative_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        CircuitBreaker(-1)
    with pytest.raises(ValueError, match="must be positive"):
        GuardedStore(MemoryStore(FakeClock()), 0)


# -- the timeout and the breaker around a store ----------------------------------------------


class HangingStore(MemoryStore):
    """A memory store that, while `hanging`, never answers (like a Redis frozen mid-reply),
    or while `failing`, fails at once (like a refused connection). Counts the calls that
    reached it."""

    def __init__(self, clock: FakeClock | None = None) -> None:
        super().__init__(clock or FakeClock())
        self.hanging = False
        self.failing = False
        self.calls = 0
        self.reset_delay_s = 0.0

    async def _trouble(self) -> None:
        self.calls += 1
        if self.failing:
            raise StoreError("ConnectionError: Connection refused")
        if self.hanging:
            await asyncio.Event().wait()  # forever

    async def start(self) -> None:
        await self._trouble()

    async def evaluate(
        self, ops: Sequence[CounterOp], record: CallRecord | None = None, dry_run: bool = False
    ) -> Evaluation:
        await self._trouble()
        return await super().evaluate(ops, record, dry_run)

    async def read_holds(self, record_key: str) -> Recorded | None:
        await self._trouble()
        return await super().read_holds(record_key)

    async def push_denials(self, entries: Sequence[str], keep: int) -> None:
        await self._trouble()
        await super().push_denials(entries, keep)

    async def recent_denials(self, count: int) -> list[str]:
        await self._trouble()
        return await super().recent_denials(count)

    async def settle(
        self,
        record_key: str,
        call_id: str,
        actual: int | None,
        holds: Sequence[Hold],
        fingerprint: str = "",
        result_digest: str | None = None,
        model: bool = False,
    ) -> tuple[SettleStatus, list[int]]:
        await self._trouble()
        return await super().settle(
            record_key, call_id, actual, holds, fingerprint, result_digest, model
        )

    async def reset(self, pattern: str) -> int:
        await self._trouble()
        await asyncio.sleep(self.reset_delay_s)
        return await super().reset(pattern)

    async def spend_records(self, pattern: str, cap: int) -> list[tuple[str, int]]:
        await self._trouble()
        await asyncio.sleep(self.reset_delay_s)  # a scan, as reset's
        return await super().spend_records(pattern, cap)

    async def ping(self) -> None:
        await self._trouble()


OP = CounterOp("rw:test", Kind.SLIDING_WINDOW, Role.ENFORCE, 5, 60_000, 5)


async def timed(coro: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    try:
        result: Any = await coro
    except StoreError as exc:
        result = exc
    return time.perf_counter() - started, result


async def test_every_operation_of_a_hung_store_ends_at_the_timeout() -> None:
    store = HangingStore()
    store.hanging = True
    guarded = GuardedStore(store, TIMEOUT_MS)  # no breaker: each call waits the timeout
    operations: list[Callable[[], Awaitable[Any]]] = [
        guarded.start,
        lambda: guarded.evaluate([OP]),
        lambda: guarded.read_holds("rw:call:x"),
        lambda: guarded.settle("rw:call:x", "x", None, []),
        lambda: guarded.push_denials(["{}"], 10),
        lambda: guarded.recent_denials(10),
        guarded.ping,
    ]
    for operation in operations:
        elapsed, result = await timed(operation())
        assert isinstance(result, StoreError), result
        assert "timed out after 100 ms" in str(result)
        assert TIMEOUT_S * 0.9 <= elapsed <= TIMEOUT_S + MARGIN_S, elapsed


async def test_a_reset_may_take_longer_than_the_timeout() -> None:
    """An admin reset scans the keyspace in many round trips: only each round trip is
    bounded (by the client's socket timeout), not the whole scan."""
    store = HangingStore()
    store.reset_delay_s = 3 * TIMEOUT_S
    guarded = GuardedStore(store, TIMEOUT_MS)
    assert await guarded.reset("rw:*") == 0


async def test_reading_spend_may_take_longer_than_the_timeout_and_fails_like_the_rest() -> None:
    """GET /v1/admin/spend scans the keyspace as a reset does: the whole scan may outlast
    the store timeout; a store that refuses it is a StoreError through the breaker."""
    store = HangingStore()
    store.reset_delay_s = 3 * TIMEOUT_S
    guarded = GuardedStore(store, TIMEOUT_MS)
    assert await guarded.spend_records("rw:spend:*", 10) == []
    store.failing = True
    elapsed, result = await timed(guarded.spend_records("rw:spend:*", 10))
    assert isinstance(result, StoreError), result
    assert elapsed < TIMEOUT_S


async def test_after_n_timeouts_a_dead_store_costs_no_timeout_per_call() -> None:
    store = HangingStore()
    store.hanging = True
    ticker = Ticker()
    b, _ = breaker(ticker)
    guarded = GuardedStore(store, TIMEOUT_MS, b)
    # Five concurrent calls meet the hang; each ends at the timeout.
    waited = await asyncio.gather(*(timed(guarded.evaluate([OP])) for _ in range(5)))
    assert all(TIMEOUT_S * 0.9 <= t <= TIMEOUT_S + MARGIN_S for t, _ in waited), waited
    assert (b.state, store.calls) == ("open", 5)
    # From now on no call reaches the store, and none waits.
    refused = [await timed(guarded.evaluate([OP])) for _ in range(50)]
    assert all(isinstance(result, CircuitOpenError) for _, result in refused)
    assert statistics.median(t for t, _ in refused) < FAST_MEDIAN_S
    assert store.calls == 5
    # After the cool-down, one probe: the store still hangs, so it waits the timeout once.
    ticker.now += 1.0
    probe, others = await asyncio.gather(
        timed(guarded.evaluate([OP])), timed(guarded.evaluate([OP]))
    )
    assert "timed out" in str(probe[1])
    assert probe[0] >= TIMEOUT_S * 0.9
    assert isinstance(others[1], CircuitOpenError)
    assert (b.state, store.calls) == ("open", 6)
    # The store comes back: the next probe succeeds and closes the circuit.
    store.hanging = False
    ticker.now += 1.0
    assert (await guarded.evaluate([OP])).results[0].admitted
    assert b.state == "closed"
    assert (await guarded.evaluate([OP])).results[0].admitted


async def test_a_caller_that_goes_away_neither_fails_nor_holds_the_probe() -> None:
    store = HangingStore()
    store.failing = True
    ticker = Ticker()
    b, _ = breaker(ticker)
    guarded = GuardedStore(store, 10 * TIMEOUT_MS, b)
    for _ in range(5):
        with pytest.raises(StoreError):
            await guarded.ping()
    store.failing, store.hanging = False, True
    ticker.now += 1.0
    probe = asyncio.ensure_future(guarded.ping())
    await asyncio.sleep(0.01)
    probe.cancel()  # the HTTP client hung up
    with pytest.raises(asyncio.CancelledError):
        await probe
    states = [b.state]
    store.hanging = False
    await guarded.ping()  # the next call is the probe, and closes the circuit
    states.append(b.state)
    assert states == ["half_open", "closed"]


async def test_an_unexpected_error_passes_through_and_releases_the_probe() -> None:
    ticker = Ticker()
    b, _ = breaker(ticker)
    fail(b, 5)
    ticker.now += 1.0

    class Broken(HangingStore):
        async def ping(self) -> None:
            raise RuntimeError("a bug, not an outage")

    guarded = GuardedStore(Broken(), TIMEOUT_MS, b)
    with pytest.raises(RuntimeError):
        await guarded.ping()
    assert b.state == "half_open"
    assert b.admit() is True


def test_the_guarded_store_passes_attributes_through() -> None:
    clock = FakeClock()
    guarded = GuardedStore(MemoryStore(clock), TIMEOUT_MS)
    assert guarded.description == MemoryStore(clock).description
    assert guarded.clock is clock


# -- fail open / fail closed, through the app ---------------------------------------------------

FAIL_POLICY = """\
version: 1
defaults: {fail: open}
rules:
  - name: vault-closed
    match: {tool: vault}
    rate: 100/minute
    fail: closed
  - name: notes-open
    match: {tool: notes}
    rate: 100/minute
    fail: open
  - name: terminal-default
    match: {tool: terminal}
    rate: 100/minute
  - name: shadow-closed
    match: {tool: shadowed}
    rate: 100/minute
    mode: shadow
    fail: closed
"""


def outage_app(
    store: HangingStore, policy: str = FAIL_POLICY, **settings: Any
) -> tuple[FastAPI, CollectorRegistry]:
    registry = CollectorRegistry()
    chosen: dict[str, Any] = {
        "store_url": "memory://",
        "fail": None,
        "store_timeout_ms": TIMEOUT_MS,
        "store_breaker_failures": 5,
        "store_breaker_cooldown_ms": 1000,
        **settings,
    }
    app = create_app(
        Settings(**chosen), store=store, policy=parse_policy(policy.encode()), registry=registry
    )
    return app, registry


@asynccontextmanager
async def outage(
    store: HangingStore, policy: str = FAIL_POLICY, **settings: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, CollectorRegistry]]:
    app, registry = outage_app(store, policy, **settings)
    async with serving(app) as client:
        yield client, registry


async def decide(client: httpx.AsyncClient, tool: str, user: str = "u") -> tuple[float, Any]:
    started = time.perf_counter()
    response = await client.post("/v1/check", json={"user": user, "tool": tool})
    elapsed = time.perf_counter() - started
    assert response.status_code == 200, response.text
    return elapsed, response.json()


Outcome = tuple[str, bool, tuple[str, ...]]


def outcome(body: dict[str, Any]) -> Outcome:
    return body["decision"], body["degraded"], tuple(v["kind"] for v in body["violations"])


OPEN: Outcome = ("allow", True, ())
CLOSED: Outcome = ("deny", True, ("unavailable",))
HEALTHY: Outcome = ("allow", False, ())


async def test_a_hung_store_decides_within_the_timeout_by_each_rules_fail_mode() -> None:
    store = HangingStore()
    async with outage(store, store_breaker_failures=0) as (client, _):
        assert outcome((await decide(client, "vault"))[1]) == HEALTHY
        store.hanging = True
        for tool, expected in (
            ("vault", CLOSED),
            ("notes", OPEN),
            ("terminal", OPEN),  # no `fail:` on the rule: the policy default (open)
            ("shadowed", OPEN),  # a shadow rule never blocks, not even fail closed
            ("unruled", ("allow", False, ())),  # no rule applies: the store is not asked
        ):
            elapsed, body = await decide(client, tool)
            assert outcome(body) == expected, tool
            assert elapsed <= TIMEOUT_S + MARGIN_S, (tool, elapsed)
        elapsed, body = await decide(client, "vault")
        assert body["message"] == "Tool guard unavailable; vault calls are paused"
        assert body["violations"][0]["rule"] == "vault-closed"
        # Many concurrent decisions: each one within the bound.
        answers = await asyncio.gather(*(decide(client, "notes", f"u{i}") for i in range(30)))
        assert all(outcome(b) == OPEN for _, b in answers)
        slowest = max(t for t, _ in answers)
        assert slowest <= TIMEOUT_S + MARGIN_S, slowest


@pytest.mark.parametrize(
    ("setting", "default", "expected"),
    [
        ("closed", "open", {"vault": CLOSED, "notes": OPEN, "terminal": CLOSED}),
        ("open", "closed", {"vault": CLOSED, "notes": OPEN, "terminal": OPEN}),
        (None, "closed", {"vault": CLOSED, "notes": OPEN, "terminal": CLOSED}),
        (None, "open", {"vault": CLOSED, "notes": OPEN, "terminal": OPEN}),
    ],
)
async def test_fail_mode_rule_then_setting_then_policy_default(
    setting: str | None, default: str, expected: dict[str, Outcome]
) -> None:
    """A rule's own `fail:` wins; else RATEWARDEN_FAIL; else the policy's defaults.fail."""
    store = HangingStore()
    store.failing = True  # down from the start: the daemon still starts and answers
    policy = FAIL_POLICY.replace("defaults: {fail: open}", f"defaults: {{fail: {default}}}")
    async with outage(store, policy, fail=setting) as (client, _):
        found = {tool: outcome((await decide(client, tool))[1]) for tool in expected}
    assert found == expected


async def test_fail_closed_globally_denies_every_tool_with_an_enforcing_rule() -> None:
    store = HangingStore()
    store.hanging = True
    policy = """\
version: 1
rules:
  - name: per-user
    rate: 100/minute
  - name: shadow
    rate: 1/minute
    mode: shadow
"""
    async with outage(store, policy, fail="closed") as (client, _):
        for tool in ("terminal", "browser_open", "anything"):
            elapsed, body = await decide(client, tool)
            assert outcome(body) == CLOSED
            assert body["message"] == f"Tool guard unavailable; {tool} calls are paused"
            assert elapsed <= TIMEOUT_S + MARGIN_S


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def poll(condition: Any, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_the_app_opens_the_circuit_reports_it_and_recovers_by_itself() -> None:
    store = HangingStore()
    async with outage(store) as (client, registry):
        assert outcome((await decide(client, "vault"))[1]) == HEALTHY
        assert sample(registry, "ratewarden_store_circuit_open") == 0
        assert (await client.get("/readyz")).status_code == 200

        store.hanging = True
        # (fail-open answers: a denial would be audited, and the audit's background flush
        # to the store could be one of the five failures)
        first = [await decide(client, "notes") for _ in range(5)]  # each waits the timeout
        assert all(outcome(b) == OPEN for _, b in first)
        assert all(TIMEOUT_S * 0.9 <= t <= TIMEOUT_S + MARGIN_S for t, _ in first), first
        calls = store.calls
        # Open: decisions by the fail mode at once, without touching the store.
        fast = [await decide(client, tool) for tool in ("vault", "notes") * 10]
        assert [outcome(b) for _, b in fast] == [CLOSED, OPEN] * 10
        assert statistics.median(t for t, _ in fast) < FAST_MEDIAN_S, fast
        assert store.calls == calls  # nothing waited for the store
        assert sample(registry, "ratewarden_store_circuit_open") == 1
        assert sample(registry, "ratewarden_store_circuit_transitions_total", state="open") == 1
        # Refusals still count as store errors (the "store errors" alert keeps firing).
        assert sample(registry, "ratewarden_store_errors_total", operation="evaluate") == 25
        ready = await client.get("/readyz")
        assert ready.status_code == 200  # it answers, by the fail mode
        assert ready.json()["answering"] == "fail mode"
        assert "circuit open" in ready.json()["store"]
        # Settle and usage answer 503 at once too.
        usage = await client.get("/v1/usage", params={"user": "u"})
        assert usage.status_code == 503
        assert store.calls == calls
        assert "circuit open" in usage.json()["message"]

        # The store comes back; within a cool-down (1-1.2 s) a call probes and closes it.
        store.hanging = False
        started = time.monotonic()
        answers: list[Outcome] = []

        async def healthy() -> bool:
            answers.append(outcome((await decide(client, "vault"))[1]))
            return answers[-1] == HEALTHY

        while not await healthy():
            assert time.monotonic() - started < 3.0, answers
            await asyncio.sleep(0.01)
        assert set(answers[:-1]) <= {CLOSED}
        assert sample(registry, "ratewarden_store_circuit_open") == 0
        for state in ("open", "half_open", "closed"):
            count = sample(registry, "ratewarden_store_circuit_transitions_total", state=state)
            assert count == 1, state
        assert (await client.get("/readyz")).status_code == 200
        assert [outcome((await decide(client, "vault"))[1]) for _ in range(3)] == [HEALTHY] * 3


async def test_an_open_circuit_is_logged_once_not_per_decision(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = HangingStore()
    store.failing = True
    async with outage(store) as (client, _):
        caplog.clear()
        for _ in range(40):
            assert outcome((await decide(client, "vault"))[1]) == CLOSED
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    opened = [m for m in warnings if m.startswith("store circuit open after")]
    assert len(opened) <= 1  # (it may have opened during start-up, before caplog.clear())
    per_decision = [m for m in warnings if m.startswith("store unavailable")]
    assert len(per_decision) <= 5, per_decision  # only the calls that met the store


# -- against redis-py and a real redis-server ------------------------------------------------


@contextmanager
def black_hole() -> Iterator[int]:
    """A TCP port that accepts connections (the kernel completes the handshake) and never
    answers: what a Redis behind a dead network path or a frozen host looks like."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(100)
        yield server.getsockname()[1]


async def test_a_server_that_never_answers_is_cut_at_the_timeout() -> None:
    with black_hole() as port:
        store = store_from_url(f"redis://127.0.0.1:{port}/0", timeout_ms=TIMEOUT_MS)
        guarded = GuardedStore(store, TIMEOUT_MS)
        try:
            operations: list[Callable[[], Awaitable[Any]]] = [
                guarded.start,
                lambda: guarded.evaluate([OP]),
                guarded.ping,
            ]
            for operation in operations:
                elapsed, result = await timed(operation())
                assert isinstance(result, StoreError), result
                assert elapsed <= TIMEOUT_S + MARGIN_S, elapsed
        finally:
            await store.close()


async def test_redis_py_retries_do_not_multiply_the_timeout() -> None:
    """store_from_url's connections never retry; and a client that does retry (here
    `?retry_on_timeout=true` in the URL) is still cut at the one deadline."""
    plain = store_from_url(f"redis://127.0.0.1:{free_port()}/0")
    connection = plain._client.connection_pool.make_connection()  # type: ignore[attr-defined]
    assert connection.retry.get_retries() == 0
    await plain.close()
    with black_hole() as port:
        url = f"redis://127.0.0.1:{port}/0?retry_on_timeout=true"
        retrying = store_from_url(url, timeout_ms=TIMEOUT_MS)
        connection = retrying._client.connection_pool.make_connection()  # type: ignore[attr-defined]
        assert connection.retry.get_retries() >= 1
        try:
            unguarded, result = await timed(retrying.ping())
            assert isinstance(result, StoreError)
            assert unguarded >= 1.9 * TIMEOUT_S  # the retry doubled it...
            guarded, result = await timed(GuardedStore(retrying, TIMEOUT_MS).ping())
            assert isinstance(result, StoreError)
            assert guarded <= TIMEOUT_S + MARGIN_S  # ...and the deadline holds anyway
        finally:
            await retrying.close()


def record(call_id: str) -> CallRecord:
    return CallRecord(f"rw:call:{{{call_id}}}", call_id, "u|t", 60_000, named=True)


@pytest.mark.redis
async def test_a_frozen_redis_times_out_and_no_late_reply_reaches_another_call(
    tmp_path: Path,
) -> None:
    """SIGSTOP freezes Redis with a command in flight; the call is cut at the timeout and
    its connection dropped, so after SIGCONT the next call reads its own reply."""
    with running_redis(tmp_path / "redis") as server:
        store = store_from_url(server.url, timeout_ms=TIMEOUT_MS)
        guarded = GuardedStore(store, TIMEOUT_MS)
        seven = CounterOp("rw:seven", Kind.SLIDING_WINDOW, Role.ENFORCE, 7, 60_000, 7)
        three = CounterOp("rw:three", Kind.SLIDING_WINDOW, Role.ENFORCE, 3, 60_000, 3)
        try:
            await guarded.start()
            os.kill(server.process.pid, signal.SIGSTOP)
            try:
                elapsed, result = await timed(guarded.evaluate([seven], record("a")))
                # (redis-py's socket timeout and the deadline are both 100 ms: either wins)
                assert isinstance(result, StoreError)
                assert re.search("timed out|Timeout", str(result)), result
                assert elapsed <= TIMEOUT_S + MARGIN_S
            finally:
                os.kill(server.process.pid, signal.SIGCONT)
            found = await guarded.evaluate([three], record("b"))
            assert (found.results[0].admitted, found.results[0].remaining) == (True, 2)
            # The frozen call may have run once Redis woke (a timeout is not a refusal);
            # it ran at most once.
            usage = await guarded.evaluate([seven], dry_run=True)
            assert usage.results[0].used in (0, 1)
        finally:
            await store.close()


@pytest.mark.redis
async def test_counters_resume_after_the_script_cache_is_emptied(tmp_path: Path) -> None:
    """A restarted Redis (or SCRIPT FLUSH) has no scripts: EVALSHA gets NOSCRIPT, the store
    loads the script again and retries once, and nothing is counted twice."""
    policy = "version: 1\nrules:\n  - name: five\n    rate: 5/minute\n    fail: closed\n"
    with running_redis(tmp_path / "redis") as server:
        store = store_from_url(server.url, timeout_ms=TIMEOUT_MS)
        app = create_app(
            Settings(store_url=server.url, fail=None, store_timeout_ms=TIMEOUT_MS),
            store=store,
            policy=parse_policy(policy.encode()),
            registry=CollectorRegistry(),
        )
        async with serving(app) as client:
            decisions = [outcome((await decide(client, "t"))[1]) for _ in range(3)]
            with server.client() as flusher:
                flusher.script_flush()
            decisions += [outcome((await decide(client, "t"))[1]) for _ in range(3)]
            assert decisions == [HEALTHY] * 5 + [("deny", False, ("rate",))]
            usage = (await client.get("/v1/usage", params={"user": "u"})).json()
            assert (usage["limits"][0]["used"], usage["limits"][0]["remaining"]) == (5, 0)


@pytest.mark.redis
async def test_pooled_connections_survive_a_redis_restart(tmp_path: Path) -> None:
    """After kill -9 and a restart, the connections left in the pool are dead. redis-py
    8's default ("auto" maintenance notifications) skips its check for closed pooled
    connections, so each would fail one command (one degraded decision each, enough of
    them to open the circuit again); store_from_url turns that off."""
    with redis_on_free_port(tmp_path / "redis") as server:
        store = store_from_url(f"redis://127.0.0.1:{server.port}/0", timeout_ms=TIMEOUT_MS)
        try:
            await store.start()
            await asyncio.gather(*(store.evaluate([OP]) for _ in range(8)))  # 8 pooled
            await asyncio.to_thread(server.kill)
            await asyncio.to_thread(server.start)  # same port, same directory (AOF)
            found = await asyncio.gather(
                *(store.evaluate([OP]) for _ in range(8)), return_exceptions=True
            )
            assert [type(x).__name__ for x in found] == ["Evaluation"] * 8, found
        finally:
            await store.close()
