"""The notifier (service/notify.py) and its webhook posts (service/webhooks.py), in
process: the signature, the backoff, the bounded queues, once per period across two
notifiers on one store, the refusal count crossing N, and what a body never holds.
tests/service/test_notify_daemons.py proves the same with two real daemons."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from ratewarden.calls import Call
from ratewarden.clock import FakeClock
from ratewarden.engine import Decision, Engine
from ratewarden.policy import parse_policy
from ratewarden.service import webhooks
from ratewarden.service.metrics import Metrics
from ratewarden.service.notify import Notifier
from ratewarden.service.webhooks import Sender, Target, backoff_s, retry_after_s, signature, verify
from ratewarden.store import MemoryStore

EVERY = frozenset({"budget.soft_limit", "budget.exhausted", "refusals.repeated"})
POLICY = b"""\
version: 1
rules:
  - name: daily
    budget: 10/day
    soft_limit: 50%
    per: [user]
  - name: per-minute
    match: {tool: terminal}
    rate: 2/minute
notifications:
  repeated_refusals: {more_than: 3, within: 10m}
  webhooks:
    - url: https://hooks.example.com/x
"""


# -- the signature -------------------------------------------------------------------


def test_the_signature_is_hmac_sha256_of_timestamp_dot_body() -> None:
    body = b'{"event":"budget.exhausted"}'
    expected = hmac.new(b"k", b"1700000000." + body, hashlib.sha256).hexdigest()
    assert signature(b"k", 1_700_000_000, body) == f"sha256={expected}"


def test_verify_accepts_ours_only_fresh_and_for_these_bytes() -> None:
    body, now = b'{"a":1}', 1_700_000_000
    good = signature(b"k", now, body)
    assert verify(b"k", str(now), body, good, now_s=now + 10)
    assert not verify(b"k", str(now), body + b" ", good, now_s=now)  # another body
    assert not verify(b"other", str(now), body, good, now_s=now)  # another secret
    assert not verify(b"k", str(now + 1), body, good, now_s=now)  # another timestamp
    assert not verify(b"k", str(now), body, good, now_s=now + 301)  # replayed late
    assert not verify(b"k", "-5", body, good, now_s=now)
    assert not verify(b"k", "1" * 40, body, good, now_s=now)


# -- backoff and Retry-After ----------------------------------------------------------


def test_backoff_doubles_with_jitter_and_is_capped() -> None:
    assert [backoff_s(n, lambda: 0.0) for n in (1, 2, 3, 4)] == [0.25, 0.5, 1.0, 2.0]
    assert [backoff_s(n, lambda: 1.0) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert backoff_s(10, lambda: 1.0) == webhooks.CAP_S
    assert backoff_s(10_000, lambda: 0.5) <= webhooks.CAP_S  # no overflow on a huge attempt


def test_retry_after_reads_seconds_and_dates_within_the_cap() -> None:
    now = 1_700_000_000.0
    assert retry_after_s("3") == 3
    assert retry_after_s("99999999999999999999") == webhooks.CAP_S
    date = format_datetime(datetime.fromtimestamp(now + 7, UTC), usegmt=True)
    assert retry_after_s(date, now_s=now) == pytest.approx(7)
    assert retry_after_s(date, now_s=now + 100) == 0  # in the past: at once
    for bad in (None, "", "soon", "-1", "1.5e3", "Mon, 99 Foo 2020"):
        assert retry_after_s(bad) is None, bad


# -- posting ---------------------------------------------------------------------------


def sender_answering(
    *answers: int | Exception, headers: dict[str, str] | None = None
) -> tuple[Sender, list[httpx.Request], list[float]]:
    """A sender whose receiver gives `answers` in turn; the requests and the waits."""
    requests: list[httpx.Request] = []
    waits: list[float] = []
    queue = list(answers)

    def handle(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        answer = queue.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return httpx.Response(answer, headers=headers or {})

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    client = httpx.AsyncClient(transport=httpx.MockTransport(handle))
    return Sender(5, 1.0, client=client, sleep=sleep, draw=lambda: 1.0), requests, waits


TARGET = Target("https://hooks.example.com/secret-path", b"s3cret", EVERY)


async def test_a_5xx_is_retried_with_backoff_and_delivered_once() -> None:
    sender, requests, waits = sender_answering(500, 503, 200)
    assert await sender.deliver(TARGET, "budget.exhausted", "id1", b"{}")
    assert len(requests) == 3
    assert waits == [0.5, 1.0]
    assert {r.headers["x-ratewarden-delivery"] for r in requests} == {"id1"}  # one id


async def test_connection_errors_and_timeouts_are_retried_until_the_attempts_run_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sender, requests, waits = sender_answering(
        httpx.ConnectError("refused"), httpx.ReadTimeout("slow"), *[httpx.ConnectError("x")] * 3
    )
    assert not await sender.deliver(TARGET, "budget.exhausted", "id2", b"{}")
    assert len(requests) == 5
    assert len(waits) == 4
    assert "https://hooks.example.com" in caplog.text
    assert "secret-path" not in caplog.text  # a URL's path can be its secret


@pytest.mark.parametrize("status", [400, 401, 404, 410, 301])
async def test_a_refusal_other_than_429_is_not_retried(status: int) -> None:
    sender, requests, waits = sender_answering(status, 200)
    assert not await sender.deliver(TARGET, "budget.exhausted", "id3", b"{}")
    assert len(requests) == 1
    assert waits == []


async def test_a_429_waits_as_long_as_retry_after_says() -> None:
    sender, _, waits = sender_answering(429, 200, headers={"Retry-After": "2"})
    assert await sender.deliver(TARGET, "budget.exhausted", "id4", b"{}")
    assert waits == [2.0]


async def test_each_post_carries_the_event_and_a_signature_that_verifies() -> None:
    sender, requests, _ = sender_answering(200)
    body = b'{"event":"budget.soft_limit"}'
    assert await sender.deliver(TARGET, "budget.soft_limit", "id5", body)
    (posted,) = requests
    assert posted.content == body
    assert posted.headers["content-type"] == "application/json"
    assert posted.headers["x-ratewarden-event"] == "budget.soft_limit"
    timestamp = posted.headers["x-ratewarden-timestamp"]
    assert verify(b"s3cret", timestamp, body, posted.headers["x-ratewarden-signature"])
    unsigned, requests, _ = sender_answering(200)
    await unsigned.deliver(Target("https://h.example/", None, EVERY), "e", "id6", body)
    assert "x-ratewarden-signature" not in requests[0].headers


# -- the notifier ------------------------------------------------------------------------


class Posted:
    """A sender that keeps what it was given (the notifier's side of a webhook)."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    async def deliver(self, target: Target, event: str, delivery: str, body: bytes) -> bool:
        self.bodies.append(json.loads(body))
        return True

    async def close(self) -> None:
        return None


def notifier_on(
    store: MemoryStore, clock: FakeClock, queue_size: int = 1000
) -> tuple[Notifier, Posted, CollectorRegistry]:
    registry = CollectorRegistry()
    posted = Posted()
    notifier = Notifier(
        store,
        Metrics(registry),
        clock,
        queue_size=queue_size,
        sender=posted,  # type: ignore[arg-type]
    )
    return notifier, posted, registry


async def drain(notifier: Notifier) -> None:
    """The worker's tick, then every queued post sent (what the tasks would do)."""
    await notifier.flush()
    outbox = notifier._outbox
    while not outbox.empty():
        target, event, delivery, body = outbox.get_nowait()
        sent = await notifier.sender.deliver(target, event, delivery, body)
        notifier._count(event, "sent" if sent else "failed")


def outcome(registry: CollectorRegistry, event: str, name: str) -> float:
    labels = {"event": event, "outcome": name}
    return registry.get_sample_value("ratewarden_notifications_total", labels) or 0.0


async def decide(engine: Engine, notifier: Notifier, call: Call) -> Decision:
    decision = await engine.check(call)
    if decision.violations or decision.warnings:  # as Observer.checked hands them over
        notifier.decided(decision, call, engine.policy)
    return decision


async def test_two_notifiers_on_one_store_send_each_budget_event_once_per_period() -> None:
    clock = FakeClock(1_700_000_000_000)
    store = MemoryStore(clock)
    policy = parse_policy(POLICY)
    engines = [Engine(policy, store, clock=clock) for _ in range(2)]
    pairs = [notifier_on(store, clock) for _ in range(2)]
    for n in range(12):  # 2.00 a call: soft limit (5.00) at the 3rd, exhausted after the 5th
        engine, (notifier, _, _) = engines[n % 2], pairs[n % 2]
        await decide(engine, notifier, Call("alice", "search", f"c{n}", cost=2.0))
        await drain(notifier)
    events = [body["event"] for _, posted, _ in pairs for body in posted.bodies]
    # the 6th to 12th calls are refused: past 3 of them, refusals.repeated too
    assert sorted(events) == ["budget.exhausted", "budget.soft_limit", "refusals.repeated"]
    soft = next(b for _, p, _ in pairs for b in p.bodies if b["event"] == "budget.soft_limit")
    assert (soft["rule"], soft["scope"], soft["user"]) == ("daily", {"user": "alice"}, "alice")
    assert (soft["spent"], soft["reserved"], soft["limit"]) == (0.0, 6.0, 10.0)
    assert soft["period_end"] == "2023-11-15T00:00:00Z"
    assert "passed its soft limit: 6.00 of 10.00" in soft["text"]
    duplicates = sum(outcome(r, "budget.exhausted", "duplicate") for _, _, r in pairs)
    assert duplicates >= 1  # the other notifier lost the claim
    clock.advance(24 * 3_600_000)  # the next day: a new period notifies afresh
    for n in range(3):
        await decide(engines[0], pairs[0][0], Call("alice", "search", f"d{n}", cost=2.0))
    await drain(pairs[0][0])
    assert [b["event"] for b in pairs[0][1].bodies].count("budget.soft_limit") == 2


async def test_refusals_past_n_in_a_window_are_told_once_across_notifiers() -> None:
    clock = FakeClock(1_700_000_000_000)
    store = MemoryStore(clock)
    policy = parse_policy(POLICY)
    engine = Engine(policy, store, clock=clock, remember_refusals=False)
    (one, posted_one, _), (two, posted_two, _) = (
        notifier_on(store, clock),
        notifier_on(store, clock),
    )
    for n in range(2):
        await decide(engine, one, Call("bob", "terminal", f"ok{n}"))
    for n in range(10):  # 10 refusals, 5 noted by each, ticks in between
        await decide(engine, (one, two)[n % 2], Call("bob", "terminal", f"no{n}"))
        if n % 3 == 2:
            await drain(one)
            await drain(two)
    await drain(one)
    await drain(two)
    (told,) = posted_one.bodies + posted_two.bodies
    assert told["event"] == "refusals.repeated"
    assert (told["rule"], told["user"], told["tool"], told["more_than"]) == (
        "per-minute",
        "bob",
        "terminal",
        3,
    )
    assert told["count"] > 3
    assert told["window"] == "10m"
    assert told["text"].startswith("User bob was refused by rule per-minute")


async def test_the_queue_is_bounded_and_what_overflows_is_counted() -> None:
    clock = FakeClock(1_700_000_000_000)
    store = MemoryStore(clock)
    engine = Engine(parse_policy(POLICY), store, clock=clock, remember_refusals=False)
    notifier, _, registry = notifier_on(store, clock, queue_size=3)
    for n in range(10):  # ten users, each exhausted by one call of 11.00
        await decide(engine, notifier, Call(f"user{n}", "search", f"c{n}", cost=11.0))
    # each refusal is a note (budget.exhausted) and a count (refusals.repeated): 20 in all
    assert len(notifier._notes) + len(notifier._refused) == 3
    dropped = [outcome(registry, e, "dropped") for e in ("budget.exhausted", "refusals.repeated")]
    assert sum(dropped) == 17


async def test_nothing_is_noted_without_a_webhook() -> None:
    clock = FakeClock(1_700_000_000_000)
    store = MemoryStore(clock)
    text = POLICY.split(b"notifications:")[0]
    engine = Engine(parse_policy(text), store, clock=clock)
    notifier, _, _ = notifier_on(store, clock)
    await decide(engine, notifier, Call("alice", "search", "c1", cost=11.0))
    assert (notifier._notes, notifier._refused) == ({}, {})


async def test_a_body_never_holds_arguments_and_names_cannot_ping_a_channel() -> None:
    clock = FakeClock(1_700_000_000_000)
    store = MemoryStore(clock)
    policy = parse_policy(
        b"version: 1\nrules:\n  - {name: by-args, budget: 1/day, per: [user, args]}\n"
        b"notifications: {webhooks: [{url: 'https://h.example/'}]}\n"
    )
    engine = Engine(policy, store, clock=clock)
    notifier, posted, _ = notifier_on(store, clock)
    call = Call("<!channel> & \u202eevil", "search", "c1", cost=5.0, args={"q": "TOPSECRET"})
    await decide(engine, notifier, call)
    await drain(notifier)
    (body,) = posted.bodies
    assert "TOPSECRET" not in json.dumps(body)
    assert body["scope"]["args"] == "(args)"  # not even the digest
    digest = call.args_digest()
    assert digest is not None
    assert digest not in json.dumps(body)
    assert "&lt;!channel&gt; &amp; \\u202eevil" in body["text"]
    assert body["user"] == "<!channel> & \u202eevil"  # the field itself is the name as it is


async def test_a_reload_that_changes_the_section_applies_to_what_follows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeClock(1_700_000_000_000)
    store = MemoryStore(clock)
    notifier, _, _ = notifier_on(store, clock)
    notifier.environ = {"HOOK_URL": "https://later.example/h", "HOOK_KEY": "k"}
    first = parse_policy(POLICY)
    notifier.configure(first)
    assert [t.url for t in notifier.targets] == ["https://hooks.example.com/x"]
    second = parse_policy(
        POLICY.replace(
            b"url: https://hooks.example.com/x",
            b"url_env: HOOK_URL\n      secret_env: HOOK_KEY\n      events: [budget.exhausted]",
        )
    )
    engine = Engine(second, store, clock=clock)
    await decide(engine, notifier, Call("alice", "search", "c1", cost=6.0))  # soft only
    assert [t.url for t in notifier.targets] == ["https://later.example/h"]
    assert notifier.targets[0].secret == b"k"
    assert notifier._notes == {}  # budget.soft_limit is no longer wanted


async def test_the_idle_worker_is_woken_by_a_note_and_stops_at_once() -> None:
    clock = FakeClock(1_700_000_000_000)
    store = MemoryStore(clock)
    engine = Engine(parse_policy(POLICY), store, clock=clock)
    notifier, posted, _ = notifier_on(store, clock)
    notifier.start()
    try:
        await asyncio.sleep(0.05)
        assert notifier._idle is not None  # waiting on a note, not on a timer
        await decide(engine, notifier, Call("alice", "search", "c1", cost=11.0))
        for _ in range(100):  # a tick (0.25 s) and the post, well within a second
            if posted.bodies:
                break
            await asyncio.sleep(0.02)
        assert [b["event"] for b in posted.bodies] == ["budget.exhausted"]
    finally:
        started = time.monotonic()
        await notifier.stop()
        assert time.monotonic() - started < 1.0
