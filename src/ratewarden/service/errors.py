"""Every error answer has one shape: `{"error", "message", "fields": [{"field", "message"}]}`."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from pydantic_core import from_json
from starlette.exceptions import HTTPException

from ratewarden.wire.bodies import ErrorResponse, FieldError
from ratewarden.wire.bounded import TooManyItems

log = logging.getLogger("ratewarden.service")
# Fields named in one answer. A 256 KiB body can hold 20 000 unknown fields; naming them
# all made a 2 MB answer that took 270 ms to write.
MAX_FIELD_ERRORS = 20
# pydantic words two errors differently for JSON (the hot path validates the raw bytes)
# and for Python objects (FastAPI parses first, then validates `from_attributes`); answers
# use FastAPI's wording, as they did before the hot path.
_PYTHON_WORDING = {
    "model_type": "Input should be a valid dictionary or object to extract fields from",
    "dict_type": "Input should be a valid dictionary",
}
_JSON_WORDING = "Input should be an object"


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _invalid_request)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected)


def error_response(
    status: int,
    error: str,
    message: str,
    fields: list[FieldError] | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body = ErrorResponse(error=error, message=message, fields=fields or [])
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    if _body_not_json(request, exc):
        problem = "expected Content-Type: application/json"
        return error_response(
            422, "invalid_request", f"body: {problem}", [FieldError(field="body", message=problem)]
        )
    errors = exc.errors()
    return invalid_request(errors, len(errors))


def invalid_request(errors: Sequence[Mapping[str, Any]], total: int) -> JSONResponse:
    """The 422 naming the field of each of `errors` (pydantic's, located from "body"), the
    first MAX_FIELD_ERRORS of `total`; shared by FastAPI's handler, the hot path and the
    routes' body reader (routes.py), so all three answer alike."""
    fields = [
        FieldError(
            field="body" if e["type"] == "json_invalid" else field_path(e["loc"]),
            message=_problem(e),
        )
        for e in errors[:MAX_FIELD_ERRORS]
    ]
    summary = "; ".join(f"{f.field}: {f.message}" for f in fields)
    if total > len(fields):
        summary += f"; and {total - len(fields)} more"
    return error_response(422, "invalid_request", summary, fields)


def refusal(exc: ValidationError) -> JSONResponse:
    """The 422 for `exc`, raised by validating a request body."""
    located = [{**e, "loc": ("body", *e["loc"])} for e in first_errors(exc)]  # as FastAPI's
    return invalid_request(located, exc.error_count())


def invalid_json(exc: json.JSONDecodeError) -> JSONResponse:
    """The 422 for a body that is not JSON, in FastAPI's words (its validation error
    `json_invalid`, at the error's position), given by the routes' reader and the hot
    path alike."""
    error = {"type": "json_invalid", "loc": ("body", exc.pos), "ctx": {"error": exc.msg}}
    return invalid_request([error], 1)


def undecodable() -> JSONResponse:
    """The 422 for a body that is not even text (say, stray UTF-16 bytes)."""
    problem = "invalid JSON: cannot decode the body"
    return error_response(
        422, "invalid_request", f"body: {problem}", [FieldError(field="body", message=problem)]
    )


def items_refusal() -> JSONResponse:
    """The 422 for a body over wire.bounded.MAX_ITEMS, refused unread (hot path and routes)."""
    problem = str(TooManyItems())
    return error_response(
        422, "invalid_request", f"body: {problem}", [FieldError(field="body", message=problem)]
    )


_NEXT_ERROR = '},{"type":"'  # between two errors in their JSON (in a string, `"` is escaped)


def first_errors(exc: ValidationError) -> Sequence[Mapping[str, Any]]:
    """The first MAX_FIELD_ERRORS of `exc`'s errors, at a cost that does not grow with the
    rest: pydantic makes Python objects of all of them at once (0.7 us each: 15 ms for a
    body of 22 000 unknown fields), but writes their JSON in Rust five times faster, and
    only the first few are read back from it."""
    if exc.error_count() <= MAX_FIELD_ERRORS:
        return exc.errors(include_url=False, include_input=False)
    text = exc.json(include_url=False, include_input=False)
    end = -1
    for _ in range(MAX_FIELD_ERRORS):
        end = text.find(_NEXT_ERROR, end + 1)
        if end < 0:  # not the layout this expects: the slow way
            return exc.errors(include_url=False, include_input=False)[:MAX_FIELD_ERRORS]
    found: list[dict[str, Any]] = from_json(text[: end + 1] + "]")
    return found


class ReadAndRefused(HTTPException):
    """A body refused while FastAPI read it (routes.py), with its 422 ready. FastAPI lets
    an HTTPException through its body reader, and does not validate the body again."""

    def __init__(self, answer: JSONResponse) -> None:
        super().__init__(422)
        self.answer = answer


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    if isinstance(exc, ReadAndRefused):
        return exc.answer
    if exc.status_code == 400 and request.method == "POST":
        return undecodable()  # FastAPI's answer to a body it cannot even decode
    # Keep the exception's headers: a 405 must say which methods are allowed (`Allow`).
    return error_response(
        exc.status_code, _error_name(exc.status_code), str(exc.detail), headers=exc.headers
    )


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    return internal_error(request.method, request.url.path)


def internal_error(method: str, path: str) -> JSONResponse:
    """The answer to a bug (logged here, with the stack trace being handled)."""
    # Not the client's fault; logged without the request body (it may hold args).
    log.exception("unexpected error on %s %s", method, path)
    return error_response(500, "internal_error", "internal error; see the daemon's log")


def _body_not_json(request: Request, exc: RequestValidationError) -> bool:
    """A JSON body sent as a form (`curl -d`) is refused with a message naming the header."""
    content_type = request.headers.get("content-type", "").lower()  # `Application/JSON` too
    body_errors = [e for e in exc.errors() if tuple(e["loc"]) == ("body",)]
    return bool(body_errors) and "json" not in content_type and request.method == "POST"


def field_path(loc: tuple[Any, ...] | list[Any]) -> str:
    """`metadata.tags[2]` for ("body", "metadata", "tags", 2); query parameters by name."""
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path"):
        parts = parts[1:]
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "body"


def _problem(error: Mapping[str, Any]) -> str:
    kind = error.get("type", "")
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "json_invalid":
        return f"invalid JSON: {error.get('ctx', {}).get('error', 'cannot parse')}"
    if kind in _PYTHON_WORDING and error.get("msg") == _JSON_WORDING:
        return _PYTHON_WORDING[kind]
    return str(error.get("msg", "invalid value")).removeprefix("Value error, ")


def _error_name(status: int) -> str:
    names = {404: "not_found", 405: "method_not_allowed", 409: "conflict", 413: "too_large"}
    return names.get(status, "http_error")
