"""Server-sent events read from chunks of bytes: the event-stream format of the WHATWG
HTML standard (§9.2), as MCP's streamable HTTP transport carries messages in it.

A decoder of a few lines rather than a dependency: `httpx-sse` and httpx2's reader work on
an httpx response, and the gateway reads its upstreams on bare connections
(`ratewarden.http.keepalive`). No SDK import, so it is tested without the `mcp` extra.
The row that re-checks the path it serves: bench/mcp_overhead.py, the gateway with a URL
upstream against the stdio proxy (docs/mcp.md).
"""

from __future__ import annotations

__all__ = ["MAX_EVENT_BYTES", "EventReader"]

MAX_EVENT_BYTES = 1024 * 1024  # one event's data (the MCP SDK client's own bound)
MAX_RETRY_S = 60.0  # the longest reconnection delay a server may ask for


class EventReader:
    """Server-sent events from chunks of bytes (the WHATWG event-stream format): feed
    chunks, take whole events' `data` (with `id` and `retry` noted). An event of no data
    (a "priming" event, an id alone) gives nothing."""

    def __init__(self, max_bytes: int = MAX_EVENT_BYTES) -> None:
        self.max_bytes = max_bytes
        self.last_id: str | None = None
        self.retry_s: float | None = None
        self._pending = b""
        self._data: list[bytes] = []
        self._size = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        """The data of each event that `chunk` completes; ValueError past `max_bytes`."""
        events: list[bytes] = []
        lines = (self._pending + chunk).splitlines(keepends=True)
        # A line is whole once its LF is seen: a CR at the end may be a CRLF's first half
        # (bytes.splitlines splits on LF, CR and CRLF only, as the format does).
        self._pending = lines.pop() if lines and not lines[-1].endswith(b"\n") else b""
        if len(self._pending) > self.max_bytes:
            raise ValueError(f"an event longer than {self.max_bytes} bytes")
        for line in lines:
            if (data := self._line(line.rstrip(b"\r\n"))) is not None:
                events.append(data)
        return events

    def end(self) -> list[bytes]:
        """The stream has ended: the event a last CR completed (held in case an LF came)."""
        return self.feed(b"\n") if self._pending.endswith(b"\r") else []

    def _line(self, line: bytes) -> bytes | None:
        if not line:  # a blank line ends the event
            data, self._data, self._size = self._data, [], 0
            return b"\n".join(data) or None  # an event of no data: a "priming" one
        name, _, value = line.partition(b":")
        value = value[1:] if value.startswith(b" ") else value
        if name == b"data":
            self._size += len(value) + 1
            if self._size > self.max_bytes:
                raise ValueError(f"an event longer than {self.max_bytes} bytes")
            self._data.append(value)
        elif name == b"id" and b"\x00" not in value:
            self.last_id = value.decode("utf-8", "replace")
        elif name == b"retry" and value.isdigit() and len(value) <= 9:
            self.retry_s = min(int(value) / 1000, MAX_RETRY_S)
        return None  # comments (a leading ':') and other fields are ignored, as specified
