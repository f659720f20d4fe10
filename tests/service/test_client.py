"""The client and the guards against a real daemon, and with no daemon at all."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ratewarden.client import (
    AsyncClient,
    AsyncGuard,
    Client,
    ClientError,
    DaemonUnavailable,
    Guard,
)
from ratewarden.wire.bodies import CheckRequest, SettleRequest
from tests.helpers.hostenv import Daemon, running_daemon
from tests.helpers.redis_server import free_port

POLICY = """\
version: 1
tools:
  terminal: {cost: 0.5}
rules:
  - name: terminal-per-minute
    match: {tool: terminal}
    rate: 3/minute
  - name: one-at-a-time
    match: {tool: browser}
    concurrency: 1
"""


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_daemon(POLICY, tmp_path_factory.mktemp("daemon")) as running:
        yield running


def nowhere() -> str:
    return f"http://127.0.0.1:{free_port()}"


def test_client_checks_settles_and_reads_usage(daemon: Daemon) -> None:
    with Client(daemon.url) as client:
        answers = [client.check(CheckRequest(user="c1", tool="terminal")) for _ in range(4)]
        assert [a.decision for a in answers] == ["allow", "allow", "allow", "deny"]
        assert answers[3].message.startswith("Rate limit: max 3 terminal calls per minute")
        first = client.check(CheckRequest(user="c1", tool="browser", call_id="b-1"))
        assert client.check(CheckRequest(user="c1", tool="browser")).decision == "deny"
        assert client.settle("b-1").outcome == "settled"
        assert client.settle("b-1").outcome == "already_settled"
        assert first.decision == "allow"
        usage = {item.rule: item for item in client.usage("c1", tool="terminal").limits}
        assert usage["terminal-per-minute"].used == 3


def test_client_errors_say_what_went_wrong(daemon: Daemon) -> None:
    with Client(daemon.url) as client:
        with pytest.raises(ClientError, match="user") as refused:
            client.check(CheckRequest.model_construct(user="", tool="t"))  # bypass validation
        assert refused.value.status == 422
        with pytest.raises(ClientError, match="no allowed call") as unknown:
            client.settle("never-checked")
        assert unknown.value.status == 404
    with Client(nowhere(), timeout=0.5) as client, pytest.raises(DaemonUnavailable):
        client.check(CheckRequest(user="u", tool="t"))


def test_settle_ids_are_escaped_in_the_path(daemon: Daemon) -> None:
    with Client(daemon.url) as client:
        call_id = "a/b?c#d e"
        client.check(CheckRequest(user="c2", tool="browser", call_id=call_id))
        assert client.settle(call_id, SettleRequest(cost=0)).call_id == call_id


async def test_async_client(daemon: Daemon) -> None:
    async with AsyncClient(daemon.url) as client:
        answers = await asyncio.gather(
            *(client.check(CheckRequest(user="c3", tool="terminal")) for _ in range(5))
        )
        assert sorted(a.decision for a in answers) == ["allow"] * 3 + ["deny"] * 2
        assert (await client.usage("c3")).user == "c3"


def test_guard_passes_answers_through(daemon: Daemon) -> None:
    guard = Guard(daemon.url)
    try:
        decisions = [
            guard.check(CheckRequest(user="g1", tool="terminal")).decision for _ in range(4)
        ]
        assert decisions == ["allow", "allow", "allow", "deny"]
        assert guard.unreachable == 0
        assert guard.settle("never-checked") is None  # logged, not raised
    finally:
        guard.close()


def test_guard_fails_open_by_default_and_counts() -> None:
    guard = Guard(nowhere(), timeout=0.5)
    answer = guard.check(CheckRequest(user="u", tool="terminal", call_id="x"))
    assert (answer.decision, answer.allowed, answer.degraded, answer.call_id) == (
        "allow",
        True,
        True,
        "x",
    )
    assert guard.unreachable == 1
    assert guard.settle("x") is None
    guard.close()


def test_guard_fails_closed_with_a_clear_message() -> None:
    guard = Guard(nowhere(), timeout=0.5, fail="closed")
    answer = guard.check(CheckRequest(user="u", tool="terminal"))
    assert (answer.decision, answer.degraded) == ("deny", True)
    assert answer.message == "Tool guard unavailable; terminal calls are paused"
    guard.close()


def test_guard_refuses_an_unknown_fail_mode() -> None:
    with pytest.raises(ValueError, match="fail must be 'open' or 'closed'"):
        Guard(nowhere(), fail="sometimes")


def test_guard_reads_the_environment(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RATEWARDEN_URL", daemon.url)
    guard = Guard()
    assert guard.url == daemon.url
    assert guard.check(CheckRequest(user="env", tool="web")).decision == "allow"
    assert guard.unreachable == 0
    guard.close()


def test_guard_is_thread_safe(daemon: Daemon) -> None:
    guard = Guard(daemon.url)
    results: list[str] = []
    lock = threading.Lock()

    def ask() -> None:
        decision = guard.check(CheckRequest(user="threads", tool="terminal")).decision
        with lock:
            results.append(decision)

    threads = [threading.Thread(target=ask) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    guard.close()
    assert sorted(results) == ["allow"] * 3 + ["deny"] * 9


async def test_async_guard_fails_by_its_mode(daemon: Daemon) -> None:
    open_guard = AsyncGuard(nowhere(), timeout=0.5)
    closed_guard = AsyncGuard(nowhere(), timeout=0.5, fail="closed")
    live = AsyncGuard(daemon.url)
    try:
        assert (await open_guard.check(CheckRequest(user="a", tool="t"))).decision == "allow"
        assert (await closed_guard.check(CheckRequest(user="a", tool="t"))).decision == "deny"
        assert (open_guard.unreachable, closed_guard.unreachable) == (1, 1)
        assert (await live.check(CheckRequest(user="async-live", tool="t"))).degraded is False
        assert await live.settle("never-checked") is None
    finally:
        for guard in (open_guard, closed_guard, live):
            await guard.aclose()


def test_client_module_loads_without_server_code(tmp_path: Path) -> None:
    import subprocess
    import sys

    probe = (
        "import sys, ratewarden.client, ratewarden.integrations._identity;"
        "heavy = [m for m in sys.modules if m.split('.')[0] in "
        "('fastapi', 'starlette', 'uvicorn', 'redis', 'prometheus_client')];"
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# The pooled socket of a loop the host has closed cannot be closed any more (its loop is
# gone); the garbage collector reclaims it, with a ResourceWarning we expect here.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_async_guard_survives_a_new_event_loop_per_turn(daemon: Daemon) -> None:
    """Hosts such as Strands run each turn in a fresh asyncio.run."""
    guard = AsyncGuard(daemon.url)
    first = asyncio.run(guard.check(CheckRequest(user="loops", tool="t")))
    second = asyncio.run(guard.check(CheckRequest(user="loops", tool="t")))
    assert (first.degraded, second.degraded) == (False, False)
    assert guard.unreachable == 0
    del guard
    gc.collect()  # reclaim the closed loops' sockets here, under this test's warning filter


def test_guards_answer_a_refused_request_by_their_fail_mode(daemon: Daemon) -> None:
    bad = CheckRequest.model_construct(user="", tool="terminal")  # the daemon answers 422
    open_guard, closed_guard = Guard(daemon.url), Guard(daemon.url, fail="closed")
    assert open_guard.check(bad).decision == "allow"
    assert closed_guard.check(bad).decision == "deny"
    assert (open_guard.unreachable, closed_guard.unreachable) == (1, 1)
    open_guard.close()
    closed_guard.close()


def test_a_refused_token_is_logged_as_an_error_not_as_an_outage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With tokens on, a guard holding the wrong one is a misconfiguration: answered by the
    fail mode (a typo must not stop every tool), but at error level, naming the token."""
    request = CheckRequest(user="u", tool="terminal")
    with running_daemon(POLICY, tmp_path, "--api-token", "right-token") as secured:
        guards = [
            Guard(secured.url, token="wrong-token"),
            Guard(secured.url, token="wrong-token", fail="closed"),
            Guard(secured.url, token="right-token"),
        ]
        with caplog.at_level(logging.WARNING, logger="ratewarden.client"):
            answers = [guard.check(request) for guard in guards]
        for guard in guards:
            guard.close()
    assert [(a.decision, a.degraded) for a in answers] == [
        ("allow", True),
        ("deny", True),
        ("allow", False),
    ]
    refusals = [r for r in caplog.records if "refused the guard's token" in r.getMessage()]
    assert [r.levelno for r in refusals] == [logging.ERROR, logging.ERROR], caplog.text
    assert "401" in refusals[0].getMessage()
    # An outage stays a warning.
    caplog.clear()
    outage = Guard(nowhere())
    with caplog.at_level(logging.WARNING, logger="ratewarden.client"):
        outage.check(request)
    outage.close()
    assert [r.levelno for r in caplog.records] == [logging.WARNING], caplog.text


def test_a_guard_with_tool_names_counts_the_applications_tool_as_the_canonical_one(
    daemon: Daemon,
) -> None:
    """An application that calls its shell `run_cmd` shares `terminal`'s counter."""
    guard = Guard(daemon.url, fail="closed", tool_names={"run_cmd": "terminal"})
    with Client(daemon.url) as client:
        assert client.check(CheckRequest(user="tn1", tool="terminal")).decision == "allow"
    answers = [guard.check(CheckRequest(user="tn1", tool="run_cmd")) for _ in range(3)]
    assert [a.decision for a in answers] == ["allow", "allow", "deny"]
    assert answers[2].message.startswith("Rate limit: max 3 terminal calls per minute")
    other = guard.check(CheckRequest(user="tn1", tool="browser"))  # a name it does not map
    assert other.decision == "allow"
    guard.close()


async def test_an_async_guard_with_tool_names_does_the_same(daemon: Daemon) -> None:
    guard = AsyncGuard(daemon.url, fail="closed", tool_names={"run_cmd": "terminal"})
    answers = [await guard.check(CheckRequest(user="tn2", tool="run_cmd")) for _ in range(4)]
    assert [a.decision for a in answers] == ["allow", "allow", "allow", "deny"]
    await guard.aclose()


@pytest.mark.parametrize(
    ("tool_names", "error"),
    [
        ({"shell": ""}, "'' is not a tool name"),
        ({"shell": "x" * 300}, "is not a tool name"),
        ({"sh\nell": "terminal"}, "'sh\\nell' is not a tool name"),
        ({"shell": 7}, "7 is not a tool name"),
        ({"terminal": "terminal"}, "'terminal' is mapped to itself"),
        (["shell", "terminal"], "tool_names must be a mapping"),
    ],
)
def test_bad_tool_names_are_refused_naming_the_parameter(tool_names: object, error: str) -> None:
    with pytest.raises((ValueError, TypeError), match="tool_names") as raised:
        Guard(nowhere(), tool_names=tool_names)  # type: ignore[arg-type]
    assert error in str(raised.value)
