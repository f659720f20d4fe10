"""Notifications end to end (issue 30, item 3): two real daemons on one real Redis post
to a real HTTP receiver on loopback. Each crossing is told once, however the calls are
spread over the daemons, and each post's signature verifies with the secret. A receiver
that fails, refuses, hangs or is gone changes nothing of the decisions."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ratewarden.service.webhooks import verify
from tests.helpers.daemon import Daemon, clean_environment, running_daemon

SECRET = "a-shared-secret-0123456789"
HANG = 0  # a receiver's answer: none, the connection held open


class Receiver:
    """An HTTP server on loopback that keeps every post and answers `answer(n)` to the
    n-th (0-based): a status, or HANG."""

    def __init__(self, answer: Callable[[int], int]) -> None:
        self.posts: list[tuple[dict[str, str], bytes]] = []
        self.release = threading.Event()
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # the standard library's name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._lock:
                    receiver.posts.append((dict(self.headers.items()), body))
                    status = answer(len(receiver.posts) - 1)
                if status == HANG:
                    receiver.release.wait(30)
                    return
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook/secret-path"

    @contextlib.contextmanager
    def running(self) -> Iterator[Receiver]:
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.release.set()
            self.server.shutdown()
            self.server.server_close()
            thread.join(10)

    def bodies(self) -> list[dict[str, Any]]:
        with self._lock:
            return [json.loads(body) for _, body in self.posts]


def policy_text(url: str) -> str:
    return f"""\
version: 1
rules:
  - name: daily
    match: {{tool: search}}
    budget: 10/day
    soft_limit: 50%
  - name: terminal-per-minute
    match: {{tool: terminal}}
    rate: 2/minute
notifications:
  repeated_refusals: {{more_than: 3, within: 10m}}
  webhooks:
    - url: {url}
      secret_env: RW_TEST_HOOK_SECRET
"""


@contextlib.contextmanager
def daemons(
    tmp_path: Path, redis_url: str, receiver: Receiver, count: int, **settings: str
) -> Iterator[list[Daemon]]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_text(receiver.url))
    env = clean_environment(RATEWARDEN_STORE_URL=redis_url, RW_TEST_HOOK_SECRET=SECRET, **settings)
    with contextlib.ExitStack() as stack:
        started = [
            stack.enter_context(running_daemon(tmp_path, "--policy", str(policy), env=env))
            for _ in range(count)
        ]
        yield started


def check(daemon: Daemon, user: str, tool: str, cost: float | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"user": user, "tool": tool}
    if cost is not None:
        body["cost"] = cost
    with httpx.Client(trust_env=False, timeout=10.0) as http:
        answer: dict[str, Any] = http.post(f"{daemon.url}/v1/check", json=body).json()
        return answer


def notifications(daemon: Daemon) -> dict[tuple[str, str], float]:
    with httpx.Client(trust_env=False, timeout=10.0) as http:
        text = http.get(f"{daemon.url}/metrics").text
    return {
        (sample.labels["event"], sample.labels["outcome"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "ratewarden_notifications"
        for sample in family.samples
        if sample.name == "ratewarden_notifications_total"
    }


def summed(fleet: list[Daemon]) -> dict[tuple[str, str], float]:
    total: dict[tuple[str, str], float] = {}
    for daemon in fleet:
        for key, value in notifications(daemon).items():
            total[key] = total.get(key, 0.0) + value
    return total


def eventually(condition: Callable[[], bool], within_s: float = 15.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {within_s} s"
        time.sleep(0.05)  # bounded polling of real processes


def test_two_daemons_tell_each_crossing_once_and_sign_it(tmp_path: Path, redis_url: str) -> None:
    with (
        Receiver(lambda n: 200).running() as receiver,
        daemons(tmp_path, redis_url, receiver, 2) as fleet,
    ):
        # alice's budget of 10.00, 2.00 a call, spread over both daemons: the 3rd call
        # passes the soft limit (6.00 of 10.00), the 6th and later are refused, each
        # daemon flagging both crossings more than once.
        decided = [check(fleet[n % 2], "alice", "search", cost=2.0) for n in range(8)]
        assert [d["decision"] for d in decided] == ["allow"] * 5 + ["deny"] * 3
        assert sum(1 for d in decided if d["warnings"]) >= 2
        # carol: 2 terminal calls a minute; 6 refusals, past the threshold of 3
        refused = [check(fleet[n % 2], "carol", "terminal")["decision"] for n in range(8)]
        assert refused == ["allow"] * 2 + ["deny"] * 6
        eventually(lambda: len(receiver.posts) >= 3)
        time.sleep(2.0)  # long past a tick of either daemon: no duplicate arrives late
        told = sorted((b["event"], b["rule"], b["user"]) for b in receiver.bodies())
        assert told == [
            ("budget.exhausted", "daily", "alice"),
            ("budget.soft_limit", "daily", "alice"),
            ("refusals.repeated", "terminal-per-minute", "carol"),
        ]  # alice's 3 budget refusals are not more than 3: no refusals.repeated for her
        for headers, body in receiver.posts:
            assert verify(
                SECRET.encode(),
                headers["X-Ratewarden-Timestamp"],
                body,
                headers["X-Ratewarden-Signature"],
            )
            assert headers["X-Ratewarden-Event"] == json.loads(body)["event"]
        counts = summed(fleet)
        assert counts[("budget.soft_limit", "sent")] == 1
        assert counts[("budget.exhausted", "sent")] == 1
        assert counts[("refusals.repeated", "sent")] == 1
        # both daemons noted the budget's crossings: the one that lost the claim said so
        assert counts[("budget.exhausted", "duplicate")] >= 1
        exhausted = next(b for b in receiver.bodies() if b["event"] == "budget.exhausted")
        assert exhausted["scope"] == {"user": "alice"}
        assert (exhausted["limit"], exhausted["currency"], exhausted["period"]) == (
            10.0,
            "USD",
            "day",
        )
        assert "is exhausted" in exhausted["text"]
        repeated = next(b for b in receiver.bodies() if b["event"] == "refusals.repeated")
        assert repeated["count"] > 3
        assert repeated["tool"] == "terminal"


def test_a_receiver_failing_twice_gets_it_once_after_retries(
    tmp_path: Path, redis_url: str
) -> None:
    with (
        Receiver(lambda n: 500 if n < 2 else 200).running() as receiver,
        daemons(tmp_path, redis_url, receiver, 1) as (daemon,),
    ):
        assert check(daemon, "dora", "search", cost=11.0)["decision"] == "deny"
        eventually(lambda: len(receiver.posts) >= 3)
        time.sleep(1.5)
        assert len(receiver.posts) == 3
        assert len({headers["X-Ratewarden-Delivery"] for headers, _ in receiver.posts}) == 1
        counts = notifications(daemon)
        assert counts[("budget.exhausted", "sent")] == 1
        assert counts[("budget.exhausted", "failed")] == 0


def test_a_4xx_is_not_retried(tmp_path: Path, redis_url: str) -> None:
    with (
        Receiver(lambda n: 400).running() as receiver,
        daemons(tmp_path, redis_url, receiver, 1) as (daemon,),
    ):
        assert check(daemon, "erin", "search", cost=11.0)["decision"] == "deny"
        eventually(lambda: notifications(daemon)[("budget.exhausted", "failed")] == 1)
        time.sleep(1.5)  # a retry would have come by now (the first backoff is 0.5 s at most)
        assert len(receiver.posts) == 1
        assert "not delivered to http://127.0.0.1" in daemon.log_text()
        assert "secret-path" not in daemon.log_text()


def _decide_through_a_bad_receiver(tmp_path: Path, redis_url: str, receiver: Receiver) -> None:
    settings = {
        "RATEWARDEN_NOTIFY_QUEUE": "2",
        "RATEWARDEN_WEBHOOK_TIMEOUT_S": "3",
        "RATEWARDEN_WEBHOOK_ATTEMPTS": "2",
    }
    with daemons(tmp_path, redis_url, receiver, 1, **settings) as (daemon,):
        slowest = 0.0
        for n in range(60):  # 60 users, each refused at once: a note and a count each
            started = time.monotonic()
            answer = check(daemon, f"user-{n}", "search", cost=11.0)
            slowest = max(slowest, time.monotonic() - started)
            assert answer["decision"] == "deny"
            assert answer["violations"][0]["rule"] == "daily"
            if n % 10 == 9:
                time.sleep(0.3)  # a tick: the worker claims, the outbox fills
        # A decision that waited for the webhook would take its 3 s timeout; half of it
        # leaves room for a busy machine (these answer in milliseconds).
        assert slowest < 1.5
        counts = notifications(daemon)
        assert (
            counts[("budget.exhausted", "dropped")] + counts[("refusals.repeated", "dropped")] > 0
        )
        assert counts[("budget.exhausted", "sent")] == 0


def test_a_hanging_receiver_neither_slows_decisions_nor_grows_the_queue(
    tmp_path: Path, redis_url: str
) -> None:
    with Receiver(lambda n: HANG).running() as receiver:
        _decide_through_a_bad_receiver(tmp_path, redis_url, receiver)


def test_a_receiver_that_is_gone_changes_nothing_either(tmp_path: Path, redis_url: str) -> None:
    receiver = Receiver(lambda n: 200)
    receiver.server.server_close()  # its port no longer listens
    _decide_through_a_bad_receiver(tmp_path, redis_url, receiver)


def test_the_settings_webhook_and_a_reloaded_section_both_post(
    tmp_path: Path, redis_url: str
) -> None:
    """RATEWARDEN_WEBHOOK_URL/SECRET: a webhook of every event with no policy section; a
    reload that adds a section sends to its webhook too, from the next notification."""
    without = policy_text("unused").split("notifications:")[0]
    policy = tmp_path / "policy.yaml"
    policy.write_text(without)
    with (
        Receiver(lambda n: 200).running() as from_settings,
        Receiver(lambda n: 200).running() as from_policy,
    ):
        env = clean_environment(
            RATEWARDEN_STORE_URL=redis_url,
            RATEWARDEN_WEBHOOK_URL=from_settings.url,
            RATEWARDEN_WEBHOOK_SECRET=SECRET,
            RATEWARDEN_RELOAD_INTERVAL_S="0.2",
            RW_TEST_HOOK_SECRET="another-secret",
        )
        with running_daemon(tmp_path, "--policy", str(policy), env=env) as daemon:
            assert check(daemon, "fay", "search", cost=11.0)["decision"] == "deny"
            eventually(lambda: len(from_settings.posts) == 1)
            headers, body = from_settings.posts[0]
            assert verify(
                SECRET.encode(),
                headers["X-Ratewarden-Timestamp"],
                body,
                headers["X-Ratewarden-Signature"],
            )
            policy.write_text(policy_text(from_policy.url))
            eventually(lambda: "policy reloaded" in daemon.log_text().lower(), 10.0)
            assert check(daemon, "gus", "search", cost=11.0)["decision"] == "deny"
            eventually(lambda: len(from_policy.posts) == 1 and len(from_settings.posts) == 2)
            headers, body = from_policy.posts[0]
            assert json.loads(body)["user"] == "gus"
            assert verify(
                b"another-secret",
                headers["X-Ratewarden-Timestamp"],
                body,
                headers["X-Ratewarden-Signature"],
            )


@pytest.mark.slow  # two daemons raced
def test_concurrent_calls_on_both_daemons_still_tell_each_crossing_once(
    tmp_path: Path, redis_url: str
) -> None:
    """Eight users' budgets crossed by calls racing on both daemons at once (16 threads):
    one notification of each event per user, no more."""
    users = [f"racer-{n}" for n in range(8)]
    with (
        Receiver(lambda n: 200).running() as receiver,
        daemons(tmp_path, redis_url, receiver, 2) as fleet,
    ):

        def spend(worker: int) -> None:
            for n in range(8):  # 8 calls of 2.00 per user per worker: 32.00 of 10.00 tried
                user = users[(worker + n) % len(users)]
                check(fleet[(worker + n) % 2], user, "search", cost=2.0)

        threads = [threading.Thread(target=spend, args=(w,)) for w in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        eventually(lambda: len(receiver.posts) >= 3 * len(users))
        time.sleep(2.0)
        told = sorted((b["event"], b["user"]) for b in receiver.bodies())
        # each user: 16 calls, 5 allowed, 11 refused (more than 3: refusals.repeated too)
        events = ("budget.exhausted", "budget.soft_limit", "refusals.repeated")
        assert told == sorted((event, user) for event in events for user in users)
