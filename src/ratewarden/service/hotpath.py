"""The hot path: valid `POST /v1/check` and `/v1/check/batch` straight to the engine,
and a host's own HTTP hook (`POST /v1/hooks/{host}`) straight to service/hooks.py.

These two routes are what every tool call of a gateway waits on. Through FastAPI's
router, dependency solver and response serialiser a decision spent more time in the
framework than in the engine and Redis together. This pure ASGI app sits in front of
FastAPI (app.py's `Daemon.front`), behind auth and the body cap (so both still apply),
and serves those two routes directly: pydantic-core validates the raw bytes in one step,
the engine decides, pydantic-core writes the JSON from the decision.

It only ever answers exactly like FastAPI would, and reads and validates a body once.
A body of more than wire.MAX_ITEMS items is refused unread (its items counted on its
bytes, here, for both paths). A body of the wrong shape is refused here, with the
answer errors.py gives FastAPI's validation error: handed on, it was validated a second
time, and a hostile body cost twice (docs/benchmarks.md, "Worst bodies"). A large body
is read by the routes' own reader (wire.read_json) and answered here whatever it holds,
invalid JSON included. Only a small body that pydantic-core cannot read in one step
(invalid JSON, a huge integer, a lone surrogate, UTF-16) or that did not arrive whole
is handed on to FastAPI, the body already read replayed: nothing was validated yet,
and FastAPI reads it with `wire.read_json` and gives the exact error (counting its
items again costs nothing: it is smaller than MAX_ITEMS bytes). The OpenAPI schema
still describes both routes (routes.py). tests/service/test_hotpath.py holds the two
paths to the same answers.

A host's HTTP hook is answered here when its query is one FastAPI's route takes as it
is (`hooks.plain_query`): FastAPI's routing and parameter handling cost a small hook
payload five to seven normal checks, most of what it cost (docs/benchmarks.md, issue 25
item 6). tests/service/test_hook_routes.py holds both paths to the same answers.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import ValidationError
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ratewarden.engine import CallIdConflict
from ratewarden.http.readahead import read_body, replay
from ratewarden.service import hooks, routes, vouch
from ratewarden.service.convert import batch_json, check_json
from ratewarden.service.errors import (
    internal_error,
    invalid_json,
    items_refusal,
    refusal,
    undecodable,
)
from ratewarden.service.metrics import HttpAnswers
from ratewarden.wire.bodies import BatchRequest, CheckRequest
from ratewarden.wire.bounded import LARGE_BODY, collector_paused, read_json, too_many_items

_JSON = (b"content-type", b"application/json")
_SERVERS = {"/v1/check": "_check", "/v1/check/batch": "_batch"}  # path -> method
HOT_ROUTES = frozenset(_SERVERS)
HOOK_PREFIX = "/v1/hooks/"  # and a host's name: `POST /v1/hooks/{host}`
HOOK_ROUTE = HOOK_PREFIX + "{host}"  # its route template (the `route` label of metrics)
_OK = {path: (path, 200) for path in _SERVERS}  # the counted key of a decision answered
REACHED = "ratewarden.hot_path"  # set in the scope of a request that reached HotPath


def is_hook(path: str) -> bool:
    """Whether `path` is a host's own HTTP hook (not the command hook's `/decision`)."""
    return path.startswith(HOOK_PREFIX) and "/" not in path[len(HOOK_PREFIX) :]


Body = TypeVar("Body", CheckRequest, BatchRequest)


class HotPath:
    def __init__(self, app: ASGIApp, answers: HttpAnswers | None = None) -> None:
        self.app = app
        # HTTP answers by route and status (metrics.py): the ones answered here are
        # counted in `counts`, the others through a wrapped `send`.
        self.answers = answers
        self.counts: dict[tuple[str, int], int] = answers.counts if answers else {}
        self._routes: dict[str, Callable[[Scope, bytes], Awaitable[bytes | Any]]] = {
            path: getattr(self, name) for path, name in _SERVERS.items()
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        scope[REACHED] = True  # past auth and the body cap (app.py's Daemon counts those)
        serve = self._routes.get(path) if scope["type"] == "http" else None
        hook = serve is None and is_hook(path)
        if hook:
            serve = self._hook  # a host's own payload: any content type
        elif serve is None or not _sends_json(scope):
            serve = None
        if serve is None or scope["method"] != "POST":
            await self.app(scope, receive, self._counted(scope, send, hook))
            return
        body = await read_body(receive)
        if body is None:
            return  # the client left before its body arrived: nobody to answer
        answer: bytes | Any
        try:
            if not hook and too_many_items(body):  # counted once, here, for both paths
                answer = items_refusal()
            else:
                answer = await serve(scope, body)
        except Exception:  # in front of FastAPI: its catch-all's answer, given here
            answer = internal_error("POST", scope["path"])
        if answer is None:  # not ours to answer: FastAPI gives the exact error
            await self.app(scope, replay(body, receive), self._counted(scope, send, hook))
        elif isinstance(answer, bytes):
            # Counted here, in a plain dict: a wrapper around `send` cost a decision
            # 3 % more instructions (service/metrics.py, HttpAnswers).
            counts, key = self.counts, (HOOK_ROUTE, 200) if hook else _OK[path]
            counts[key] = counts.get(key, 0) + 1
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [_JSON, (b"content-length", str(len(answer)).encode())],
                }
            )
            await send({"type": "http.response.body", "body": answer})
        else:  # an error response of routes.py
            await answer(scope, receive, self._counted(scope, send, hook))

    def _counted(self, scope: Scope, send: Send, hook: bool) -> Send:
        """`send`, counting the answer under this route (an answer not given here)."""
        if self.answers is None:
            return send
        path = scope["path"]
        route = HOOK_ROUTE if hook else path if path in HOT_ROUTES else None  # else its own
        return self.answers.wrap(scope, send, route)

    async def _check(self, scope: Scope, body: bytes) -> Any:
        if len(body) > LARGE_BODY:
            request = _read_large(CheckRequest, body)
            if not isinstance(request, CheckRequest):
                return request  # a refusal
        else:
            try:
                request = CheckRequest.model_validate_json(body)  # one step from the bytes
            except ValidationError as exc:
                return _refusal(exc)
        vouched = vouch.check_in(scope, request)
        if not isinstance(vouched, CheckRequest):
            return vouched  # a refusal
        try:
            decision = await routes.decide(scope["app"], vouched)
        except CallIdConflict as exc:
            return routes.conflict(exc)
        return check_json(decision)

    async def _hook(self, scope: Scope, body: bytes) -> Any:
        """A host's own HTTP hook (service/hooks.py): FastAPI's routing and parameter
        handling cost a small payload several normal checks (docs/benchmarks.md)."""
        query = hooks.plain_query(scope)
        if query is None:
            return None  # a parameter FastAPI refuses: its exact answer
        params, user, team, fail = query
        host = scope["path"].removeprefix(HOOK_PREFIX)
        return await hooks.answer(scope["app"], scope, host, params, body, user, team, fail)

    async def _batch(self, scope: Scope, body: bytes) -> Any:
        if len(body) > LARGE_BODY:
            request = _read_large(BatchRequest, body)
            if not isinstance(request, BatchRequest):
                return request
        else:
            try:
                request = BatchRequest.model_validate_json(body)
            except ValidationError as exc:
                return _refusal(exc)
        vouched = vouch.batch_for(vouch.caller_of(scope), request)
        if not isinstance(vouched, BatchRequest):
            return vouched  # a refusal
        decided = await routes.decide_batch(scope["app"], vouched)
        if not isinstance(decided, list):
            return decided  # the conflict's error response
        return batch_json(decided)


def _read_large(model: type[Body], body: bytes) -> Body | JSONResponse:
    """A large body validated as `model`, or refused.

    From the bytes in one step, pydantic-core parses into a tree of its own, copies it
    into Python objects, and copies it again into an error: a large body is read into
    Python objects once, by the routes' own reader, then validated as FastAPI does (2 to
    3 times cheaper for 256 KiB of arrays), and answered here whatever it holds: handed
    on, it was read again. Refused, it is freed (with `exc`) before the collector runs
    again.
    """
    with collector_paused():  # wire.LARGE_BODY says why
        try:
            read = model.model_validate  # no name holds the body's objects but `exc`
            return read(read_json(body, counted=True), from_attributes=True)
        except ValidationError as exc:
            return refusal(exc)
        except json.JSONDecodeError as exc:
            return invalid_json(exc)
        except UnicodeDecodeError:
            return undecodable()


def _refusal(exc: ValidationError) -> JSONResponse | None:
    """FastAPI's 422 for a body of the wrong shape; None for JSON pydantic-core cannot
    read, which FastAPI answers (its parser reads more: huge integers, lone surrogates,
    UTF-16)."""
    if exc.error_count() == 1 and exc.errors()[0]["type"] == "json_invalid":
        return None
    return refusal(exc)


def _sends_json(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return bool(value.split(b";", 1)[0].strip().lower() == b"application/json")
    return False
