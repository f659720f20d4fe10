"""A cap on request bodies, as a pure ASGI middleware.

Bytes are counted as they arrive, so a chunked body (no `Content-Length`) is capped
exactly like a declared one: the application is never handed more than `max_bytes`,
and the request is answered 413 in the project's error shape as soon as the cap is
passed, with `Connection: close` so the server stops reading the rest. A declared
`Content-Length` over the cap is refused before a single body byte is read.

It wraps the whole application (outside FastAPI's own exception handling), so the 413 does
not depend on how an endpoint or a framework version reacts to a body cut short.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(Exception):
    """Raised into the application when its request body passes the cap."""


class BodySizeLimit:
    """Answer 413 to any HTTP request whose body is larger than `max_bytes`."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self.refuse(send)  # nothing of the body is read
            return
        await _Guarded(self, receive, send).run(scope)

    async def refuse(self, send: Send) -> None:
        """The 413, in the error shape of every other refusal."""
        problem = f"larger than the {self.max_bytes}-byte limit (RATEWARDEN_MAX_BODY_BYTES)"
        body = json.dumps(
            {
                "error": "too_large",
                "message": f"body: {problem}",
                "fields": [{"field": "body", "message": problem}],
            },
            separators=(",", ":"),
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    # The rest of the body is never read: the connection cannot be reused.
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _Guarded:
    """One request: count what the application receives; past the cap, answer 413 instead."""

    def __init__(self, limit: BodySizeLimit, receive: Receive, send: Send) -> None:
        self.limit = limit
        self._receive = receive
        self._send = send
        self.received = 0
        self.exceeded = False
        self.started = False  # the application began its own response

    async def receive(self) -> Message:
        if self.exceeded:
            # Whatever the application asks for now, the body is over: act as if the client left.
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.limit.max_bytes:
                self.exceeded = True
                raise BodyTooLarge(f"request body over {self.limit.max_bytes} bytes")
        return message

    async def send(self, message: Message) -> None:
        if self.exceeded and not self.started:
            return  # the application's answer to a body cut short; the 413 replaces it
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)

    async def run(self, scope: Scope) -> None:
        try:
            await self.limit.app(scope, self.receive, self.send)
        except Exception:
            # BodyTooLarge itself, or whatever the application made of the body cut short.
            if not self.exceeded or self.started:
                raise
        if self.exceeded and not self.started:
            await self.limit.refuse(self._send)


def _content_length(scope: Scope) -> int | None:
    """The declared body length, or None when absent or unreadable (then bytes are counted)."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            text = bytes(value).strip()
            return int(text) if text.isdigit() else None
    return None
