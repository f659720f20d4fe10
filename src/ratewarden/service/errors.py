"""Every error answer has one shape: `{"error", "message", "fields": [{"field", "message"}]}`."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from ratewarden.wire import ErrorResponse, FieldError

log = logging.getLogger("ratewarden.service")


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
    fields = [
        FieldError(
            field="body" if e["type"] == "json_invalid" else field_path(e["loc"]),
            message=_problem(e),
        )
        for e in exc.errors()
    ]
    summary = "; ".join(f"{f.field}: {f.message}" for f in fields)
    return error_response(422, "invalid_request", summary, fields)


async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
    if exc.status_code == 400 and request.method == "POST":
        # FastAPI's answer to a body it cannot even decode (say, stray UTF-16 bytes).
        problem = "invalid JSON: cannot decode the body"
        return error_response(
            422, "invalid_request", f"body: {problem}", [FieldError(field="body", message=problem)]
        )
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
    content_type = request.headers.get("content-type", "")
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


def _problem(error: dict[str, Any]) -> str:
    kind = error.get("type", "")
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "json_invalid":
        return f"invalid JSON: {error.get('ctx', {}).get('error', 'cannot parse')}"
    return str(error.get("msg", "invalid value")).removeprefix("Value error, ")


def _error_name(status: int) -> str:
    names = {404: "not_found", 405: "method_not_allowed", 409: "conflict", 413: "too_large"}
    return names.get(status, "http_error")
