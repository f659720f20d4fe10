"""The hot path: valid `POST /v1/check` and `/v1/check/batch` straight to the engine.

These two routes are what every tool call of a gateway waits on. Through FastAPI's
router, dependency solver and response serialiser a decision spent more time in the
framework than in the engine and Redis together. This pure ASGI app sits in front of
FastAPI (app.py's `Daemon.front`), behind auth and the body cap (so both still apply),
and serves those two routes directly: pydantic-core validates the raw bytes in one step,
the engine decides, pydantic-core writes the JSON from the decision.

It only ever serves what it can serve exactly like FastAPI would. Anything else (not
JSON, invalid, a body that did not arrive whole) is handed on to FastAPI, with the body
already read replayed, so every error keeps its one shape and wording (errors.py) and
the OpenAPI schema still describes both routes (routes.py). tests/test_hotpath.py holds
the two paths to the same answers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ratewarden.engine import CallIdConflict
from ratewarden.service import routes
from ratewarden.service.convert import batch_json, check_json
from ratewarden.service.errors import internal_error
from ratewarden.wire import BatchRequest, CheckRequest

_JSON = (b"content-type", b"application/json")
_SERVERS = {"/v1/check": "_check", "/v1/check/batch": "_batch"}  # path -> method
HOT_ROUTES = frozenset(_SERVERS)


class HotPath:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._routes: dict[str, Callable[[Any, bytes], Awaitable[bytes | Any]]] = {
            path: getattr(self, name) for path, name in _SERVERS.items()
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        serve = self._routes.get(scope["path"]) if scope["type"] == "http" else None
        if serve is None or scope["method"] != "POST" or not _sends_json(scope):
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        if body is None:
            return  # the client left before its body arrived: nobody to answer
        try:
            answer = await serve(scope["app"], body)
        except Exception:  # in front of FastAPI: its catch-all's answer, given here
            answer = internal_error("POST", scope["path"])
        if answer is None:  # not ours to answer: FastAPI gives the exact error
            await self.app(scope, _replay(body, receive), send)
        elif isinstance(answer, bytes):
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [_JSON, (b"content-length", str(len(answer)).encode())],
                }
            )
            await send({"type": "http.response.body", "body": answer})
        else:
            await answer(scope, receive, send)  # an error response of routes.py

    async def _check(self, app: Any, body: bytes) -> Any:
        try:
            request = CheckRequest.model_validate_json(body)
        except ValidationError:
            return None
        try:
            decision = await routes.decide(app, request)
        except CallIdConflict as exc:
            return routes.conflict(exc)
        return check_json(decision)

    async def _batch(self, app: Any, body: bytes) -> Any:
        try:
            request = BatchRequest.model_validate_json(body)
        except ValidationError:
            return None
        decided = await routes.decide_batch(app, request)
        if not isinstance(decided, list):
            return decided  # the conflict's error response
        return batch_json(decided)


def _sends_json(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return bool(value.split(b";", 1)[0].strip().lower() == b"application/json")
    return False


async def _read_body(receive: Receive) -> bytes | None:
    """The whole body, or None if the client left first (the body cap is applied outside)."""
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
