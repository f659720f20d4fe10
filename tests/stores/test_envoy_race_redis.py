"""Envoy's rate limit service scaled out: two daemons on one real Redis, each with its gRPC
listener, raced by four client processes, as a cluster of rate limit services behind Envoy
is. The guarantees hold across them: exactly the limit is allowed, a budget is never
overspent and is charged exactly what was allowed; and with Redis gone, each daemon
answers by its fail mode (docs/envoy.md, "Fail modes").
"""

from __future__ import annotations

import multiprocessing.synchronize
import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from envoy.extensions.common.ratelimit.v3.ratelimit_pb2 import RateLimitDescriptor
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

from tests.helpers.daemon import Daemon, running_daemon
from tests.helpers.races import race
from tests.helpers.redis_server import free_port, running_redis

pytestmark = pytest.mark.slow  # daemons and processes started per test

POLICY = """\
version: 1
defaults: {fail: closed}
rules:
  - name: terminal-per-minute
    match: {tool: terminal}
    per: [user]
    rate: 10/minute
  - name: paid-search
    match: {tool: paid_search}
    per: [user]
    budget: 1.00/day
  - name: web-open
    match: {tool: web_search}
    per: [user]
    rate: 5/minute
    fail: open
"""
OK, OVER = rls_pb2.RateLimitResponse.OK, rls_pb2.RateLimitResponse.OVER_LIMIT
PER_PROCESS = 25


def _ask(port: int, user: str, tool: str, hits: int = 0) -> int:
    entries = [RateLimitDescriptor.Entry(key="user", value=user),
               RateLimitDescriptor.Entry(key="tool", value=tool)]  # fmt: skip
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        request = rls_pb2.RateLimitRequest(
            domain="agents", descriptors=[RateLimitDescriptor(entries=entries)], hits_addend=hits
        )
        answer: int = stub.ShouldRateLimit(request, timeout=10).overall_code
        return answer


def _hammer(
    ports: list[int],
    tool: str,
    hits: int,
    barrier: multiprocessing.synchronize.Barrier,
    results: Any,
    n: int,
) -> None:
    barrier.wait()
    codes = [_ask(ports[(n + i) % 2], "racer", tool, hits) for i in range(PER_PROCESS)]
    results.put(codes)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[list[Daemon], list[int], Any]]:
    """Two daemons on one fresh redis-server, each with a gRPC port."""
    with ExitStack() as stack:
        redis = stack.enter_context(running_redis(tmp_path / "redis"))
        daemons, ports = [], []
        for name in ("a", "b"):
            directory = tmp_path / name
            directory.mkdir()
            (directory / "policy.yaml").write_text(POLICY)
            port = free_port()
            flags = ("--policy", "policy.yaml", "--store-url", redis.url, "--grpc-port", str(port))
            daemons.append(stack.enter_context(running_daemon(directory, *flags)))
            ports.append(port)
        yield daemons, ports, redis


def test_exactly_the_limit_is_allowed_across_daemons(
    fleet: tuple[list[Daemon], list[int], Any],
) -> None:
    _, ports, _ = fleet
    outcomes, codes = race(_hammer, (ports, "terminal", 0), 4)
    assert codes == [0, 0, 0, 0]
    answers = [code for batch in outcomes for code in batch]
    assert len(answers) == 4 * PER_PROCESS
    assert answers.count(OK) == 10
    assert answers.count(OVER) == 4 * PER_PROCESS - 10


def test_a_budget_is_charged_exactly_what_was_allowed_and_never_more(
    fleet: tuple[list[Daemon], list[int], Any],
) -> None:
    daemons, ports, _ = fleet
    outcomes, codes = race(_hammer, (ports, "paid_search", 70_000), 4)  # 0.07 each
    assert codes == [0, 0, 0, 0]
    allowed = sum(batch.count(OK) for batch in outcomes)
    assert allowed == 14  # 14 x 0.07 = 0.98; a 15th would pass 1.00
    with httpx.Client(trust_env=False, timeout=10) as http:
        usage = http.get(f"{daemons[0].url}/v1/usage", params={"user": "racer"}).json()
    found = {item["rule"]: item for item in usage["limits"]}["paid-search"]
    assert found["used"] == pytest.approx(allowed * 0.07)
    assert found["reserved"] == 0  # each charged at once: nothing left held


def test_with_redis_gone_each_rule_follows_its_fail_mode(
    fleet: tuple[list[Daemon], list[int], Any],
) -> None:
    daemons, ports, redis = fleet
    assert _ask(ports[0], "lone", "terminal") == OK
    redis.stop()
    assert _ask(ports[0], "lone", "terminal") == OVER  # fail closed: refused, with why
    with grpc.insecure_channel(f"127.0.0.1:{ports[1]}") as channel:
        entries = [RateLimitDescriptor.Entry(key="user", value="lone"),
                   RateLimitDescriptor.Entry(key="tool", value="terminal")]  # fmt: skip
        answer = rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(
            rls_pb2.RateLimitRequest(descriptors=[RateLimitDescriptor(entries=entries)]),
            timeout=10,
        )
    assert answer.overall_code == OVER
    assert "unavailable" in answer.raw_body.decode().lower()
    assert _ask(ports[1], "lone", "web_search") == OK  # this rule fails open
    for daemon in daemons:
        assert daemon.process.poll() is None  # still serving


def test_a_frozen_redis_is_answered_by_the_fail_mode_in_bounded_time(
    fleet: tuple[list[Daemon], list[int], Any],
) -> None:
    """SIGSTOP, not a closed socket: the store's deadline answers, by the fail mode, and
    the listener serves again once Redis does."""
    _, ports, redis = fleet
    redis.process.send_signal(signal.SIGSTOP)
    try:
        assert _ask(ports[0], "frozen", "terminal") == OVER  # within _ask's 10 s timeout
        assert _ask(ports[0], "frozen", "web_search") == OK
    finally:
        redis.process.send_signal(signal.SIGCONT)
    for _ in range(50):  # the breaker, if it opened, closes after its 1 s cooldown
        if _ask(ports[0], "thawed", "terminal") == OK:
            break
        time.sleep(0.1)
    else:
        pytest.fail("never allowed again after Redis thawed")


def test_the_listener_on_a_busy_port_stops_the_start_saying_so(tmp_path: Path) -> None:
    with ExitStack() as stack:
        port = free_port()
        first = tmp_path / "first"
        first.mkdir()
        stack.enter_context(running_daemon(first, "--grpc-port", str(port)))
        second = tmp_path / "second"
        second.mkdir()
        with pytest.raises(pytest.fail.Exception) as failed:
            stack.enter_context(running_daemon(second, "--grpc-port", str(port)))
        assert f"cannot listen for gRPC on port {port}" in str(failed.value)


def test_a_daemons_workers_share_the_grpc_port_and_the_counters(tmp_path: Path) -> None:
    """`--workers 2`: each worker listens on the gRPC port (SO_REUSEPORT), the kernel
    spreads new connections over them, and the limit holds exactly across both."""
    with ExitStack() as stack:
        redis = stack.enter_context(running_redis(tmp_path / "redis"))
        (tmp_path / "policy.yaml").write_text(POLICY)
        port = free_port()
        flags = ("--policy", "policy.yaml", "--store-url", redis.url, "--workers", "2",
                 "--grpc-port", str(port))  # fmt: skip
        daemon = stack.enter_context(running_daemon(tmp_path, *flags))
        for _ in range(100):  # both workers up: each says so once
            if daemon.log_text().count(f"on grpc://127.0.0.1:{port}") == 2:
                break
            time.sleep(0.1)
        assert daemon.log_text().count(f"on grpc://127.0.0.1:{port}") == 2
        outcomes, codes = race(_hammer, ([port, port], "terminal", 0), 4)
        assert codes == [0, 0, 0, 0]
        answers = [code for batch in outcomes for code in batch]
        assert (answers.count(OK), answers.count(OVER)) == (10, 4 * PER_PROCESS - 10)
