"""The command hook's own HTTP/1.1 client (http/exchange.py `post`): what it makes of
answers a daemon, a proxy or a stranger on the port could give. Each case is a real
socket on loopback, served by a thread that answers with fixed bytes."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from ratewarden.hooks.command import HookOptions, run
from ratewarden.hooks.hosts import HOSTS
from ratewarden.http.exchange import MAX_ANSWER_BYTES

PRE = json.dumps(
    {"hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {"command": "ls"}}
).encode()
DENY = json.dumps({"decision": "deny", "message": "Rate limit: max 1 Bash calls per minute"})


@contextmanager
def answering(answer: bytes | None) -> Iterator[tuple[str, list[bytes]]]:
    """A server on a free port that reads one request and writes `answer` (None: writes
    nothing and holds the connection open), then closes."""
    listener = socket.create_server(("127.0.0.1", 0))
    requests: list[bytes] = []
    release = threading.Event()

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            requests.append(connection.recv(65536))
            if answer is None:
                release.wait(10)
            else:
                with contextlib.suppress(OSError):  # a client that stopped reading
                    connection.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", requests
    finally:
        release.set()
        thread.join(10)
        listener.close()


def http_answer(body: str, *, chunked: bool = False, status: str = "200 OK") -> bytes:
    data = body.encode()
    if chunked:
        half = len(data) // 2
        parts = [data[:half], data[half:]]
        framed = b"".join(b"%x;ext=1\r\n%b\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
        return f"HTTP/1.1 {status}\r\ntransfer-encoding: chunked\r\n\r\n".encode() + framed
    head = f"HTTP/1.1 {status}\r\ncontent-length: {len(data)}\r\n\r\n".encode()
    return head + data + b"trailing bytes past the length"


def ask(url: str, **options: object) -> tuple[int, str, tuple[str, ...]]:
    output = run(HOSTS["claude-code"], HookOptions(url=url, **options), PRE, {})  # type: ignore[arg-type]
    return output.code, output.stdout, output.stderr


@pytest.mark.parametrize("chunked", [False, True])
def test_a_refusal_is_read_whether_sized_or_chunked(chunked: bool) -> None:
    with answering(http_answer(DENY, chunked=chunked)) as (url, requests):
        _, stdout, _ = ask(url, user="u", token="t0ken")
    decision = json.loads(stdout)["hookSpecificOutput"]
    assert decision["permissionDecision"] == "deny"
    assert decision["permissionDecisionReason"] == "Rate limit: max 1 Bash calls per minute"
    request = requests[0]
    assert request.startswith(b"POST /v1/hooks/claude-code/decision HTTP/1.1\r\n")
    assert b"\r\nauthorization: Bearer t0ken\r\n" in request
    assert json.loads(request.partition(b"\r\n\r\n")[2])["user"] == "u"


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (b"", "not an HTTP answer"),
        (b"SSH-2.0-OpenSSH_9.2\r\n", "not an HTTP answer"),
        (http_answer("not json"), "not JSON"),
        (http_answer("[1, 2]"), "not a JSON object"),
        (http_answer('{"message": "no"}', status="503 Service Unavailable"), "503: no"),
        # Not grown into memory until the timeout: refused past the cap.
        (http_answer("x" * (2 * MAX_ANSWER_BYTES)), f"longer than {MAX_ANSWER_BYTES} bytes"),
    ],
)
def test_an_answer_it_cannot_use_follows_the_fail_mode(answer: bytes, why: str) -> None:
    with answering(answer) as (url, _):
        opened = ask(url)
    assert opened[:2] == (0, "")
    assert why in opened[2][0]
    assert opened[2][0].endswith("failing open")
    with answering(answer) as (url, _):
        closed = ask(url, fail="closed")
    reason = json.loads(closed[1])["hookSpecificOutput"]["permissionDecisionReason"]
    assert reason == "Tool guard unavailable; Bash calls are paused"


def test_a_daemon_that_never_answers_costs_the_timeout_then_the_fail_mode() -> None:
    with answering(None) as (url, _):
        _, stdout, stderr = ask(url, timeout=0.3, fail="closed")
    assert "timed out" in stderr[-1]
    assert json.loads(stdout)["hookSpecificOutput"]["permissionDecision"] == "deny"


@pytest.mark.slow
def test_a_token_with_a_line_break_is_never_sent() -> None:
    with answering(http_answer(DENY)) as (url, requests):
        _, stdout, stderr = ask(url, token="t\r\nx-injected: 1")
    assert "control character" in stderr[0]
    assert stdout == ""  # failing open, nothing asked: no header smuggled anywhere
    assert requests == [] or b"x-injected" not in requests[0]


@pytest.mark.parametrize("url", ["ftp://127.0.0.1:1", "127.0.0.1:8470", "http://"])
def test_a_url_that_is_not_http_is_an_unreachable_daemon(url: str) -> None:
    code, stdout, stderr = ask(url)
    assert (code, stdout) == (0, "")
    assert "daemon unreachable" in stderr[0]
