"""Issue 15, item 5: idle and half-sent connections are closed, and connections are capped.

Every test runs `ratewarden serve` as a real process and talks to it over real sockets:
what is under test is how the server treats a socket, below any route. A peer that opens
sockets and sends nothing, half of its headers, or headers and half of a body must lose
them after `RATEWARDEN_REQUEST_TIMEOUT_S`; one that opens more than the file limit allows
must be refused at once (a 503), never starve the daemon of the descriptors its own files
need; and a legitimate client is kept out no longer than the timeout.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from ratewarden.cli import main
from ratewarden.service.settings import Settings
from tests.helpers.daemon import Daemon, clean_environment, running_daemon
from tests.helpers.redis_server import RedisServer

# Bounds on waits for something that must happen, generous for a busy machine: a failure
# means it never happened, not that it was slow.
EVENTUALLY_S = 20.0

POLICY = """\
version: 1
rules:
  - name: gate
    match: {tool: gated}
    rate: 0/minute
    message: "policy {version} refuses"
"""

# What each kind of hostile socket sends, and then it waits.
HALF_HEADERS = b"POST /v1/check HTTP/1.1\r\nHost: ratewarden\r\nContent-"
HALF_BODY = (
    b"POST /v1/check HTTP/1.1\r\nHost: ratewarden\r\nContent-Type: application/json\r\n"
    b'Content-Length: 100\r\n\r\n{"user": "mallory", '
)
HOSTILE = {"silent": b"", "half headers": HALF_HEADERS, "headers and half a body": HALF_BODY}


def connect(daemon: Daemon) -> socket.socket:
    return socket.create_connection(("127.0.0.1", daemon.port), timeout=EVENTUALLY_S)


LOWERED = (
    "import resource, runpy; "
    "resource.setrlimit(resource.RLIMIT_NOFILE, ({files}, {files})); "
    "runpy.run_module('ratewarden', run_name='__main__', alter_sys=True)"
)


@contextmanager
def serving(cwd: Path, *flags: str, files: int | None = None, **env: str) -> Iterator[Daemon]:
    """`ratewarden serve` on a free port, its open-file limit lowered to `files` if given."""
    # The limit is lowered inside the daemon's own process, before it starts (what
    # `ulimit -n` or systemd's LimitNOFILE= do), so the daemon reads it as its own.
    command = [sys.executable, "-m", "ratewarden"]
    if files is not None:
        command[1:] = ["-c", LOWERED.format(files=files)]
    environment = clean_environment(RATEWARDEN_STATE_FILE="off", **env)
    with running_daemon(cwd, *flags, env=environment, command=command) as daemon:
        yield daemon


def eventually(condition: Callable[[], bool], what: str, daemon: Daemon) -> None:
    deadline = time.monotonic() + EVENTUALLY_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {EVENTUALLY_S}s: {what}\n{daemon.log_text()}")
        time.sleep(0.05)  # bounded polling of a real process


def hostile(daemon: Daemon, sends: bytes) -> socket.socket:
    sock = connect(daemon)
    with contextlib.suppress(OSError):  # refused at once: the sending is not what is tested
        sock.sendall(sends)
    return sock


def closed_by_the_daemon(sock: socket.socket) -> bytes:
    """Read until the daemon closes `sock` (a reset counts); what it sent first, if anything.

    Waits at most EVENTUALLY_S: a socket the daemon keeps open fails the test.
    """
    sock.settimeout(EVENTUALLY_S)
    received = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return received
        except TimeoutError:
            pytest.fail(f"the daemon kept the socket open (after receiving {received!r})")
        if not chunk:
            return received
        received += chunk


def all_closed(socks: list[socket.socket]) -> None:
    """Every socket of `socks` is closed by the daemon (bounded in total, not per socket)."""
    deadline = time.monotonic() + EVENTUALLY_S
    open_ = list(socks)
    while open_:
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"{len(open_)} of {len(socks)} sockets still open after {EVENTUALLY_S}s")
        readable, _, _ = select.select(open_, [], [], left)
        for sock in readable:
            try:
                done = not sock.recv(65536)
            except ConnectionResetError:
                done = True
            if done:
                open_.remove(sock)


# -- the flood: more idle sockets than the file limit allows -------------------------------


FILE_LIMIT = 128  # the daemon's open-file limit in the flood test
# The default cap it must derive: the limit minus a reserve of max(64, limit / 4) files.
DEFAULT_CAP = 64
TIMEOUT_S = 3.0  # long enough for the flood to be in place before its sockets expire


@pytest.mark.slow
def test_hole5_idle_sockets_cannot_shut_out_a_client(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.replace("{version}", "A"))
    flags = ("--policy", str(policy), "--reload-interval", "0")
    timeout = {"RATEWARDEN_REQUEST_TIMEOUT_S": str(TIMEOUT_S)}
    with (
        serving(tmp_path, *flags, files=FILE_LIMIT, **timeout) as daemon,
        ExitStack() as held,
    ):
        own_files = files_of(daemon)
        # More sockets than the daemon may hold files, of every kind, from one peer.
        flood = [
            hostile(daemon, sends) for _ in range(FILE_LIMIT // 2) for sends in HOSTILE.values()
        ]
        for sock in flood:
            held.callback(sock.close)
        assert len(flood) > FILE_LIMIT

        # Every place for a connection is taken (give or take the few files the daemon's
        # count held a moment ago for the health check's connection, closing meanwhile).
        flooded = lambda: files_of(daemon) >= own_files + DEFAULT_CAP - 4  # noqa: E731
        eventually(flooded, "the flood is accepted", daemon)
        # Its own files still open while the flood holds every place: a reload, say.
        policy.write_text(POLICY.replace("{version}", "B"))
        daemon.process.send_signal(signal.SIGHUP)

        # A legitimate client retries as it is refused, and gets in once the flood's sockets
        # are closed for not sending a whole request in time.
        answer, refusals = client_retrying(daemon, TIMEOUT_S + EVENTUALLY_S)
        # Refused at once with a 503 while the flood held every place (before: every
        # connection was dropped unanswered, for as long as the flood lasted).
        assert 503 in refusals, refusals
        assert set(refusals) <= {503, 0}, refusals  # 0: reset before the 503 could be read
        # The reload, sent during the flood, went through: the answer is the new policy's.
        assert answer["decision"] == "deny"
        assert answer["message"] == "policy B refuses"

        all_closed(flood)  # each one: refused at once, or closed at the timeout
        log = daemon.log_text()
        assert "Too many open files" not in log
        assert "policy reload (SIGHUP) refused" not in log
        assert "policy reloaded (SIGHUP)" in log
        # The derived cap (limit minus the reserve), reported once for the whole burst.
        assert log.count("connection cap reached") == 1, log
        assert f"connection cap reached: {DEFAULT_CAP} connections open" in log
        assert "connections back under the cap" in log


def files_of(daemon: Daemon) -> int:
    return len(os.listdir(f"/proc/{daemon.process.pid}/fd"))


def client_retrying(daemon: Daemon, patience_s: float) -> tuple[dict[str, Any], list[int]]:
    """A check, retried until answered 200: the answer, and each refusal's status."""
    refusals: list[int] = []
    deadline = time.monotonic() + patience_s
    while time.monotonic() < deadline:
        try:
            reply = httpx.post(
                f"{daemon.url}/v1/check",
                json={"user": "alice", "tool": "gated"},
                timeout=2.0,
                trust_env=False,
            )
        except httpx.TransportError:
            refusals.append(0)
        else:
            if reply.status_code == 200:
                answer: dict[str, Any] = reply.json()
                return answer, refusals
            refusals.append(reply.status_code)
        time.sleep(0.1)  # a client's pause between retries
    pytest.fail(f"the client never got in ({len(refusals)} refusals)\n{daemon.log_text()}")


# -- each kind of slow request, closed after the timeout -----------------------------------

SHORT_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    cwd = tmp_path_factory.mktemp("serve")
    with serving(cwd, RATEWARDEN_REQUEST_TIMEOUT_S=str(SHORT_TIMEOUT_S)) as running:
        yield running


@pytest.mark.parametrize("sends", HOSTILE.values(), ids=HOSTILE.keys())
@pytest.mark.slow
def test_hole5_a_request_that_never_arrives_whole_is_closed(daemon: Daemon, sends: bytes) -> None:
    with hostile(daemon, sends) as sock:
        assert closed_by_the_daemon(sock) == b""  # closed unanswered


def test_hole5_a_half_request_after_an_answer_is_closed(daemon: Daemon) -> None:
    """The next request on a kept-alive connection has its deadline too, pipelined or not."""
    healthz = b"GET /healthz HTTP/1.1\r\nHost: ratewarden\r\n\r\n"
    with hostile(daemon, healthz + HALF_BODY) as sock:
        received = closed_by_the_daemon(sock)
    assert received.startswith(b"HTTP/1.1 200 ")
    assert received.count(b"HTTP/1.1 ") == 1  # the half request: closed unanswered


def test_hole5_headers_sent_a_byte_at_a_time_are_closed(daemon: Daemon) -> None:
    """A deadline on the whole request, not on silence: a trickle does not keep it open."""
    trickle = b"GET /healthz HTTP/1.1\r\nHost: ratewarden\r\nX-Pad: " + b"a" * 1000
    with connect(daemon) as sock:
        for byte in trickle:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break  # closed by the daemon
            readable, _, _ = select.select([sock], [], [], 0.05)
            if readable:
                break  # closed by the daemon (its end of the stream)
        else:
            pytest.fail("a trickled request stayed open for 50 s")
        assert closed_by_the_daemon(sock) == b""


def test_requests_sent_in_time_are_answered(daemon: Daemon) -> None:
    """The deadline cuts no honest client: parts a moment apart, several requests in a row
    on one connection for longer than the timeout in all, each within it, are all answered."""
    body = b'{"user": "bob", "tool": "t"}'
    request = (
        b"POST /v1/check HTTP/1.1\r\nHost: ratewarden\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    with httpx.Client(base_url=daemon.url, trust_env=False) as client:
        for _ in range(4):  # one kept-alive connection, 1.2 timeouts in all
            assert client.get("/healthz").status_code == 200
            time.sleep(SHORT_TIMEOUT_S * 0.3)
    with connect(daemon) as sock:
        for part in (request[:20], request[20:80], request[80:]):
            sock.sendall(part)
            time.sleep(SHORT_TIMEOUT_S * 0.1)
        sock.settimeout(EVENTUALLY_S)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")


@pytest.mark.redis
@pytest.mark.slow
def test_hole5_every_worker_closes_silent_sockets(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """Workers are processes of their own: each applies the deadline it reads from the
    environment."""
    flags = ("--workers", "2", "--store-url", redis_server.url)
    with serving(tmp_path, *flags, RATEWARDEN_REQUEST_TIMEOUT_S=str(SHORT_TIMEOUT_S)) as daemon:
        eventually(lambda: daemon.log_text().count(" ready on ") == 2, "two workers", daemon)
        silent = [connect(daemon) for _ in range(8)]  # spread over both workers
        try:
            all_closed(silent)
        finally:
            for sock in silent:
                sock.close()


# -- the cap leaves room for the daemon's own files ----------------------------------------


def test_hole5_the_cap_leaves_room_for_the_daemons_files() -> None:
    from ratewarden.http.connections import NoRoomForConnections, connection_limits

    default = Settings()
    for files, cap in [(128, 64), (256, 192), (1024, 768), (20_000, 15_000), (65, 1)]:
        limits, warning = connection_limits(default, file_limit=files)
        assert (limits.max_connections, warning) == (cap, None)
        assert limits.request_timeout_s == default.request_timeout_s == 5.0

    limits, warning = connection_limits(Settings(max_connections=500), file_limit=1024)
    assert (limits.max_connections, warning) == (500, None)
    # A configured cap that would leave the daemon no files is lowered, and said so.
    limits, warning = connection_limits(Settings(max_connections=5000), file_limit=1024)
    assert limits.max_connections == 768
    assert warning is not None
    assert "RATEWARDEN_MAX_CONNECTIONS=5000" in warning
    assert "open-file limit (1024)" in warning
    assert "at most 768 connections" in warning

    with pytest.raises(NoRoomForConnections, match=r"open-file limit \(64\) leaves no room"):
        connection_limits(default, file_limit=64)


def test_hole5_serve_refuses_a_file_limit_without_room(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ratewarden.http import connections

    monkeypatch.setattr(connections, "open_file_limit", lambda: 50)
    assert main(["serve", "--port", "0"]) == 2
    assert "open-file limit (50) leaves no room for client connections" in capsys.readouterr().err
