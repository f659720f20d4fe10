"""A cap on request bodies, as a pure ASGI middleware.

Bytes are counted as they arrive, so a chunked body (no `Content-Length`) is capped
exactly like a declared one: the application is never handed more than `max_bytes`,
and the request is answered 413 in the project's error shape as soon as the cap is
passed, with `Connection: close` so the server stops reading the rest. A declared
`Content-Length` over the cap is refused before a single body byte is read.

It wraps the whole application (outside FastAPI's own exception handling), so the 413 does
not depend on how an endpoint or a framework version reacts to a body cut short.

Why not a library: Starlette and FastAPI have no body cap, and uvicorn reads whatever a
client sends; the MCP SDK's `RequestBodyLimitMiddleware` (which the gateway uses for its
own cap) is not a daemon dependency and cannot answer a host's hook in the host's form.
The row that re-checks it: "Worst bodies" in docs/benchmarks.md (bench/worstbody.py), the
costliest bodies within the caps against a normal check.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

# A path's own refusal of a body over its cap (status, media type, body), or None.
Refusal = Callable[[str, str], tuple[int, str, bytes] | None]


class BodyTooLarge(Exception):
    """Raised into the application when its request body passes the cap."""


# A host's own HTTP hook posts the tool's whole input (a file Claude Code writes, say),
# which may pass the API's cap; past its own, larger one, the host's hook fails.
HOOK_PATHS = "/v1/hooks/"


class BodySizeLimit:
    """Answer 413 to any HTTP request whose body is larger than `max_bytes` (a host's own
    HTTP hook, `/v1/hooks/{host}`: `hook_max_bytes`, answered by `hook_refusal` in the
    host's own form when it gives one)."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        hook_max_bytes: int | None = None,
        hook_refusal: Refusal | None = None,
    ) -> None:
        if max_bytes < 0 or (hook_max_bytes or 0) < 0:
            raise ValueError("max_bytes must be >= 0")
        self.app = app
        self.max_bytes = max_bytes
        self.hook_max_bytes = max_bytes if hook_max_bytes is None else hook_max_bytes
        self.hook_refusal = hook_refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        cap, setting = self._cap(scope.get("path", ""))
        declared = _content_length(scope)
        if declared is not None and declared > cap:
            await self.refuse(send, cap, setting, scope.get("path", ""))  # nothing is read
            return
        await _Guarded(self, cap, setting, receive, send).run(scope)

    def _cap(self, path: str) -> tuple[int, str]:
        if path.startswith(HOOK_PATHS) and not path.endswith("/decision"):
            return self.hook_max_bytes, "RATEWARDEN_MAX_HOOK_BODY_BYTES"
        return self.max_bytes, "RATEWARDEN_MAX_BODY_BYTES"

    async def refuse(self, send: Send, cap: int, setting: str, path: str = "") -> None:
        """The 413, in the error shape of every other refusal; to a host's own HTTP hook,
        its own refusal instead (a host runs the call on a 413)."""
        problem = f"larger than the {cap}-byte limit ({setting})"
        own = None
        if self.hook_refusal is not None and path.startswith(HOOK_PATHS):
            own = self.hook_refusal(path, problem)
        status, media, body = own or (413, "application/json", b"")
        if status == 413:
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
                "status": status,
                "headers": [
                    (b"content-type", media.encode()),
                    (b"content-length", str(len(body)).encode()),
                    # The rest of the body is never read: the connection cannot be reused.
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


class _Guarded:
    """One request: count what the application receives; past the cap, answer 413 instead."""

    def __init__(
        self, limit: BodySizeLimit, cap: int, setting: str, receive: Receive, send: Send
    ) -> None:
        self.limit = limit
        self.cap, self.setting = cap, setting
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
            if self.received > self.cap:
                self.exceeded = True
                raise BodyTooLarge(f"request body over {self.cap} bytes")
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
            await self.limit.refuse(self._send, self.cap, self.setting, scope.get("path", ""))


def _content_length(scope: Scope) -> int | None:
    """The declared body length, or None when absent or unreadable (then bytes are counted)."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            text = bytes(value).strip()
            return int(text) if text.isdigit() else None
    return None
