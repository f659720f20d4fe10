"""Clients send a call's `args` exactly while the daemon's policy reads them (issue 17, 5).

A scripted daemon (httpx.MockTransport) records every request body and answers
`send_args` as the test says its policy does; a fake clock stands for time.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from ratewarden.client import ARGS_FRESH_S, ArgsGate, AsyncClient, Client
from ratewarden.wire.bodies import CheckRequest

ARGS = {"command": "rm -rf /tmp/x", "cwd": "/"}


class Daemon:
    """What a client sent, and a policy that reads args or not."""

    def __init__(self, reads_args: bool) -> None:
        self.reads_args = reads_args
        self.seen: list[tuple[str, dict[str, Any] | None]] = []

    def answer(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.seen.append((request.url.path, body))
        if request.url.path == "/v1/capabilities":
            return httpx.Response(200, json={"policy_version": "v", "send_args": self.reads_args})
        assert body is not None
        return httpx.Response(
            200,
            json={
                "decision": "allow",
                "allowed": True,
                "message": "",
                "call_id": "c",
                "send_args": self.reads_args,
            },
        )

    def sent_args(self) -> list[bool]:
        """For each check sent, whether it carried args."""
        return [b is not None and "args" in b for p, b in self.seen if p == "/v1/check"]

    def asked(self) -> int:
        return sum(1 for path, _ in self.seen if path == "/v1/capabilities")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def client_for(daemon: Daemon, clock: Clock) -> Client:
    client = Client("http://daemon", transport=httpx.MockTransport(daemon.answer))
    client.args = ArgsGate(clock)
    return client


def check(client: Client, args: dict[str, Any] | None = ARGS) -> None:
    client.check(CheckRequest(user="u", tool="terminal", args=args))


def test_a_policy_that_does_not_read_args_never_gets_them() -> None:
    daemon, clock = Daemon(reads_args=False), Clock()
    client = client_for(daemon, clock)
    for _ in range(3):
        check(client)
    assert daemon.sent_args() == [False, False, False]
    assert daemon.asked() == 1  # before the first check; each answer renewed it


def test_a_policy_that_reads_args_gets_them_from_the_first_check() -> None:
    daemon, clock = Daemon(reads_args=True), Clock()
    client = client_for(daemon, clock)
    check(client)
    check(client)
    assert daemon.sent_args() == [True, True]
    assert daemon.asked() == 1


def test_a_reload_that_adds_an_args_rule_reaches_the_client_at_its_next_call() -> None:
    daemon, clock = Daemon(reads_args=False), Clock()
    client = client_for(daemon, clock)
    check(client)
    daemon.reads_args = True  # the daemon reloaded; its next answer says so
    check(client)  # decided on the old word: no args yet
    check(client)
    assert daemon.sent_args() == [False, False, True]
    daemon.reads_args = False  # and back
    check(client)
    check(client)
    assert daemon.sent_args()[-2:] == [True, False]


def test_an_idle_client_asks_again_before_it_sends() -> None:
    daemon, clock = Daemon(reads_args=False), Clock()
    client = client_for(daemon, clock)
    check(client)
    daemon.reads_args = True
    clock.now += ARGS_FRESH_S  # no answer renewed it: too old to go by
    check(client)
    assert daemon.asked() == 2
    assert daemon.sent_args() == [False, True]


def test_a_call_without_args_never_asks() -> None:
    daemon, clock = Daemon(reads_args=True), Clock()
    client = client_for(daemon, clock)
    check(client, args=None)
    assert daemon.asked() == 0
    assert daemon.sent_args() == [False]


def test_the_async_client_does_the_same() -> None:
    daemon = Daemon(reads_args=False)

    async def run() -> None:
        async with AsyncClient(
            "http://daemon", transport=httpx.MockTransport(daemon.answer)
        ) as client:
            await client.check(CheckRequest(user="u", tool="t", args=ARGS))
            daemon.reads_args = True
            await client.check(CheckRequest(user="u", tool="t", args=ARGS))
            await client.check(CheckRequest(user="u", tool="t", args=ARGS))

    asyncio.run(run())
    assert daemon.sent_args() == [False, False, True]
    assert daemon.asked() == 1


def test_a_daemon_without_capabilities_gets_no_args_and_the_check_still_runs() -> None:
    """A daemon older than GET /v1/capabilities answers it 404: it reads no args."""
    daemon = Daemon(reads_args=False)

    def old_daemon(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/capabilities":
            daemon.seen.append((request.url.path, None))
            return httpx.Response(404, json={"error": "not_found", "message": "Not Found"})
        return daemon.answer(request)

    client = Client("http://daemon", transport=httpx.MockTransport(old_daemon))
    check(client)
    assert daemon.sent_args() == [False]
