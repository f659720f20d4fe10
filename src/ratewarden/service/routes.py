"""The v1 endpoints. Thin: parse, hand to the engine, shape the answer."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse

from ratewarden.engine import Engine
from ratewarden.service.convert import to_call, to_response, to_usage_item
from ratewarden.service.errors import error_response
from ratewarden.store import StoreError
from ratewarden.wire import (
    BatchRequest,
    BatchResponse,
    CheckRequest,
    CheckResponse,
    ErrorResponse,
    PolicyResponse,
    UsageResponse,
)

router = APIRouter()
Subject = Annotated[str, Query(min_length=1, max_length=256)]
OptionalSubject = Annotated[str | None, Query(min_length=1, max_length=256)]
ERRORS: dict[int | str, dict[str, object]] = {422: {"model": ErrorResponse}}


def engine_of(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


@router.post("/v1/check", response_model=CheckResponse, responses=ERRORS, tags=["decide"])
async def check(body: CheckRequest, request: Request) -> CheckResponse:
    """Decide one call: allow, deny or ask, with the reason the model will read."""
    decision = await engine_of(request).check(to_call(body))
    return to_response(decision)


@router.post("/v1/check/batch", response_model=BatchResponse, responses=ERRORS, tags=["decide"])
async def check_batch(body: BatchRequest, request: Request) -> BatchResponse:
    """Decide a model's parallel tool calls, in order; each call is all or nothing on its own."""
    engine = engine_of(request)
    results = [to_response(await engine.check(to_call(call))) for call in body.calls]
    return BatchResponse(results=results)


@router.get("/v1/usage", response_model=UsageResponse, responses=ERRORS, tags=["inspect"])
async def usage(
    request: Request,
    user: Subject,
    tool: OptionalSubject = None,
    session: OptionalSubject = None,
    team: OptionalSubject = None,
) -> UsageResponse | JSONResponse:
    """A user's counters: used and remaining per rule, read without consuming anything."""
    try:
        items = await engine_of(request).usage(user, tool, session, team)
    except StoreError as exc:
        return error_response(503, "store_unavailable", f"the store did not answer: {exc}")
    return UsageResponse(
        user=user, tool=tool, session=session, team=team, limits=[to_usage_item(i) for i in items]
    )


@router.get("/v1/policy", response_model=PolicyResponse, tags=["inspect"])
async def policy(request: Request) -> PolicyResponse:
    """The policy in force and its version hash."""
    current = engine_of(request).policy
    return PolicyResponse(version=current.version, source=current.source, policy=current.document)


@router.get("/healthz", tags=["health"])
async def healthz() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


@router.get("/readyz", tags=["health"])
async def readyz(request: Request) -> JSONResponse:
    """Readiness: a policy is loaded and the store answers."""
    engine = engine_of(request)
    try:
        await engine.store.ping()
    except StoreError as exc:
        return JSONResponse({"status": "unavailable", "store": str(exc)}, status_code=503)
    return JSONResponse({"status": "ready", "policy": engine.policy.version})
