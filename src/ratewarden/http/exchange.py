"""The command hook's one HTTP exchange with the daemon: a POST on a fresh socket, with the
standard library only.

Why not a library: `ratewarden hook` is a process per tool call, and its start is what a
coding agent waits for before every call. Importing httpx, or even the standard library's
http.client, costs more than the rest of the hook's start (`python -X importtime`); a
socket and a few formatted lines cost nothing the interpreter has not loaded already. The
row that re-checks it: bench/hookstart.py, the hook's start against a bare `python -c pass`
(docs/benchmarks.md). The head is written and checked by `head`, as the async client's is.
"""

from __future__ import annotations

import socket
import time
import urllib.parse

from ratewarden.http import head

# The most of an answer the hook reads: the daemon's check and settle answers are a few
# kB; a URL pointing elsewhere must not grow the hook's memory until its timeout.
MAX_ANSWER_BYTES = 1024 * 1024


def post(url: str, path: str, body: bytes, token: str | None, timeout: float) -> tuple[int, bytes]:
    """POST `body` as JSON in one HTTP/1.1 request (`Connection: close`); the answer's status
    and body, within `timeout` in all.

    ValueError for a URL or an answer it cannot use, OSError for the connection.
    """
    parts = urllib.parse.urlsplit(url)
    secure = parts.scheme == "https"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    host, port = parts.hostname, parts.port or (443 if secure else 80)
    deadline = time.monotonic() + timeout
    headers = {
        "host": parts.netloc.rpartition("@")[2],
        "content-type": "application/json",
        "content-length": str(len(body)),
        "connection": "close",
    }
    if token:
        headers["authorization"] = f"Bearer {token}"
    request = head.encode("POST", f"{parts.path.rstrip('/')}{path}", head.checked(headers), body)
    with socket.create_connection((host, port), timeout=timeout) as raw_socket:
        sock = raw_socket
        if secure:
            import ssl  # only for https: half of what a plain request imports

            sock = ssl.create_default_context().wrap_socket(raw_socket, server_hostname=host)
        sock.sendall(request)
        return _answer(_read_all(sock, deadline))


def _read_all(sock: socket.socket, deadline: float) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        sock.settimeout(left)
        data = sock.recv(65536)
        if not data:
            return b"".join(chunks)
        chunks.append(data)
        size += len(data)
        if size > MAX_ANSWER_BYTES:
            raise ValueError(f"an answer longer than {MAX_ANSWER_BYTES} bytes")


def _answer(raw: bytes) -> tuple[int, bytes]:
    """The status and body of a whole HTTP/1.1 answer."""
    head, separator, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.split(b"\r\n")
    version, _, rest = status_line.partition(b" ")
    if not separator or not version.startswith(b"HTTP/1.") or not rest[:3].isdigit():
        raise ValueError("not an HTTP answer")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        body = _unchunked(body)
    elif b"content-length" in headers:
        body = body[: int(headers[b"content-length"])]
    return int(rest[:3]), body


def _unchunked(body: bytes) -> bytes:
    parts: list[bytes] = []
    while True:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return b"".join(parts)
        parts.append(body[:size])
        body = body[size + 2 :]
