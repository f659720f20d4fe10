"""The connection guard: every request arrives whole in time, and open connections are capped.

uvicorn closes a keep-alive connection left idle after an answer, and nothing else: a
socket that sends nothing, half of its headers, or its headers and half of a body stays
open for ever, before auth or any route sees a byte of it. One peer holding a thousand
of them took every file descriptor of the daemon: no client got in, and a policy reload
failed with "Too many open files" (issue 15). This module is the home of both answers,
at the protocol level, where such sockets are seen:

- **A deadline per request** (`RATEWARDEN_REQUEST_TIMEOUT_S`). A connection must deliver
  a whole request (headers and body) within the timeout of opening, and each next one
  within the timeout of the previous answer; otherwise it is aborted, unanswered. While
  a whole request is being answered, no clock runs. One timer per connection, re-armed
  only when it fires: a request costs one clock read (about 0.5 us), no timer or task.
- **A cap on open connections** (`RATEWARDEN_MAX_CONNECTIONS`). Past it, a new connection
  gets a 503 and is closed at once, so an excess socket never holds a descriptor. By
  default the cap is the open-file limit minus what the daemon keeps for itself, so
  whatever the peers do, its store connections, policy and state files still open.
  Reaching the cap is logged once per burst, not once per socket.

Why not a library: uvicorn has no deadline on a request still arriving, and a front proxy
that has one is not always there; the guard lives in the protocol uvicorn already runs
(tests/unit/test_trusted_internals.py holds the internals it reads). The row that
re-checks its cost: bench/run's one rule / floor, every request of which passes it.

`GuardedHttpProtocol` is uvicorn's httptools protocol (what `uvicorn[standard]` serves
with) plus the two; `cli/` hands it to uvicorn. Each worker process guards its own
connections against its own file limit.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import resource
from dataclasses import dataclass
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from ratewarden.http.settings import ConnectionSettings

log = logging.getLogger("ratewarden.connections")

# Descriptors kept for the daemon itself (listening socket, event loop, store connections,
# policy, state and log files): a quarter of the open-file limit, and never fewer than 64.
# Decisions share one pipelined Redis connection, but settles and reads use a pool that
# grows with the calls in flight, so the reserve grows with the limit.
RESERVE_MIN = 64
RESERVE_SHARE = 4
# RLIM_INFINITY is read as Linux's default ceiling of open files (fs.nr_open).
UNLIMITED_FILES = 1 << 20
# Once the cap is reached, the burst ends when open connections fall back under this share
# of it: a daemon hovering at the cap logs one burst, not one per connection that closes.
BURST_END = 0.9


class NoRoomForConnections(ValueError):
    """The open-file limit leaves no descriptor for a single client connection."""


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    request_timeout_s: float
    max_connections: int


def open_file_limit() -> int:
    """This process's soft RLIMIT_NOFILE: how many descriptors it may hold at once."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return UNLIMITED_FILES if soft == resource.RLIM_INFINITY else soft


def room_for_connections(file_limit: int) -> int:
    """The largest cap that leaves the daemon its reserve of descriptors."""
    return file_limit - max(RESERVE_MIN, file_limit // RESERVE_SHARE)


def connection_limits(
    settings: ConnectionSettings, file_limit: int | None = None
) -> tuple[ConnectionLimits, str | None]:
    """The limits to serve with, and a warning when the configured cap had to be lowered.

    A configured cap is never trusted past the room the file limit leaves: one more
    connection would take a descriptor the daemon needs for itself.
    """
    files = open_file_limit() if file_limit is None else file_limit
    room = room_for_connections(files)
    if room < 1:
        raise NoRoomForConnections(
            f"the open-file limit ({files}) leaves no room for client connections after "
            f"the {files - room} files the daemon keeps for itself; raise it (ulimit -n, "
            "systemd LimitNOFILE=, docker --ulimit nofile=)"
        )
    wanted = settings.max_connections
    cap = room if wanted is None else min(wanted, room)
    limits = ConnectionLimits(settings.request_timeout_s, cap)
    if wanted is None or wanted <= room:
        return limits, None
    return limits, (
        f"RATEWARDEN_MAX_CONNECTIONS={wanted} would leave no room for the daemon's own files "
        f"under the open-file limit ({files}); serving at most {room} connections. Raise the "
        "limit (ulimit -n, systemd LimitNOFILE=, docker --ulimit nofile=) to allow more"
    )


class ConnectionGate:
    """What every connection of one process shares: the limits, and the cap's burst."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.busy = _busy_response(limits)
        self._burst_ends_below = max(1, int(limits.max_connections * BURST_END))
        self.refused = 0  # connections refused in the current burst
        self.full = False

    def refuse(self, open_now: int) -> None:
        if not self.full:
            self.full = True
            self.refused = 0
            log.warning(
                "connection cap reached: %d connections open (RATEWARDEN_MAX_CONNECTIONS); "
                "new connections are answered 503 and closed until some close",
                open_now,
            )
        self.refused += 1

    def closed(self, open_now: int) -> None:
        if self.full and open_now < self._burst_ends_below:
            self.full = False
            log.warning(
                "connections back under the cap: %d open; %d refused meanwhile",
                open_now,
                self.refused,
            )


def _busy_response(limits: ConnectionLimits) -> bytes:
    """The 503 of a refused connection, in the error shape of every other refusal."""
    message = (
        f"too many open connections (at most {limits.max_connections}, "
        "RATEWARDEN_MAX_CONNECTIONS); retry shortly"
    )
    body = json.dumps({"error": "unavailable", "message": message, "fields": []}).encode()
    # Every held connection is gone within the request timeout: a retry then gets a place.
    retry = max(1, math.ceil(limits.request_timeout_s))
    head = (
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nretry-after: {retry}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


_gate: ConnectionGate | None = None


def configure(limits: ConnectionLimits) -> None:
    """Set this process's limits (`serve` does, before uvicorn accepts a connection)."""
    global _gate  # noqa: PLW0603 - one server per process; uvicorn builds each protocol
    _gate = ConnectionGate(limits)


def install(settings: ConnectionSettings) -> None:
    """`configure` from `settings`, and say in the log what the limits are (and why)."""
    limits, warning = connection_limits(settings)
    if warning is not None:
        log.warning("%s", warning)
    log.info(
        "at most %d open connections per process; each request must arrive whole within "
        "%gs (RATEWARDEN_MAX_CONNECTIONS, RATEWARDEN_REQUEST_TIMEOUT_S)",
        limits.max_connections,
        limits.request_timeout_s,
    )
    configure(limits)


def gate() -> ConnectionGate:
    """This process's gate; a worker process reads its limits from the environment."""
    if _gate is None:
        configure(connection_limits(ConnectionSettings())[0])
    assert _gate is not None
    return _gate


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with the request deadline and the connection cap.

    The only cost per request is one clock read when an answer completes: the timer reads
    uvicorn's own request state (`cycle`) when it fires, instead of every request moving it.
    """

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._gate = gate()
        self._timeout = self._gate.limits.request_timeout_s
        self._since = 0.0  # the connection opened, or the last answer went out
        self._timer: asyncio.TimerHandle | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self._gate.limits.max_connections:
            self._refused = True  # never counted among the connections, nor served
            self._gate.refuse(len(self.connections))
            transport.write(self._gate.busy)
            transport.close()
            return
        super().connection_made(transport)
        self._since = self.loop.time()
        self._timer = self.loop.call_later(self._timeout, self._on_timer)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused:
            return
        super().connection_lost(exc)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._gate.closed(len(self.connections))

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._since = self.loop.time()  # the next request is due whole within the timeout

    def _answering(self) -> bool:
        """A whole request is in hand, its answer not yet complete."""
        cycle = self.cycle
        return cycle is not None and not cycle.response_complete and not cycle.more_body

    def _on_timer(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return  # closed, or handed to another protocol that closed it (an upgrade)
        if self._answering():
            delay = self._timeout  # its answer restarts the clock
        else:
            # No request yet, or one still arriving (a pipelined one too): due by now?
            delay = self._since + self._timeout - self.loop.time()
            if delay <= 0:
                # Nothing is owed to a peer that did not send its request in time; abort
                # frees the descriptor at once, whatever is left unsent.
                self.transport.abort()
                return
        self._timer = self.loop.call_later(delay, self._on_timer)
