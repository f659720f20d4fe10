"""The v1 endpoints. Thin: parse, hand to the engine, shape the answer."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import AfterValidator, TypeAdapter, ValidationError
from starlette.convertors import PathConvertor, register_url_convertor

from ratewarden.engine import CallIdConflict, Decision, Engine, NotAModelCall
from ratewarden.service import resets, vouch
from ratewarden.service.audit import RECENT_LIMIT
from ratewarden.service.auth import admin_name
from ratewarden.service.convert import to_call, to_response, to_usage_item
from ratewarden.service.errors import (
    ReadAndRefused,
    error_response,
    invalid_json,
    items_refusal,
    refusal,
)
from ratewarden.service.metrics import exposition
from ratewarden.service.observer import Observer
from ratewarden.service.reload import PolicyReloader, ReloadResponse
from ratewarden.store import StoreError
from ratewarden.wire.bodies import (
    SETTLE_PATH,
    BatchRequest,
    BatchResponse,
    Capabilities,
    CheckRequest,
    CheckResponse,
    DenialsResponse,
    ErrorResponse,
    FieldError,
    PolicyResponse,
    ResetRequest,
    ResetResponse,
    SettleRequest,
    SettleResponse,
    UnshownRule,
    UsageResponse,
    no_control_characters,
)
from ratewarden.wire.bounded import TooManyItems, read_json


class _Route(APIRoute):
    """Every v1 route: FastAPI reads a JSON body through `_JSONRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()
        body = self.body_field.field_info.annotation if self.body_field else None
        body_type = None if body is None else TypeAdapter(body)

        async def read_json_strictly(request: Request) -> Response:
            return await handle(_JSONRequest(request, body_type))

        return read_json_strictly


class _JSONRequest(Request):
    """A request whose JSON body is read by `wire.read_json` (a body of too many items is
    refused unread, a value no field takes is refused naming its field, not as `body:
    invalid JSON`, and invalid JSON in FastAPI's words) and checked against its route's
    body type as it is read. Refused, it is answered at once (errors.ReadAndRefused): then
    FastAPI does not validate it a second time, and never meets its errors, which it
    would have copied one by one (35 ms for a body of 20 000 unknown fields)."""

    def __init__(self, request: Request, body_type: TypeAdapter[Any] | None) -> None:
        super().__init__(request.scope, request.receive)
        self.body_type = body_type

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            try:
                self._json = read_json(await self.body())
            except TooManyItems:
                raise ReadAndRefused(items_refusal()) from None
            except json.JSONDecodeError as exc:  # FastAPI's answer, as the hot path gives it
                raise ReadAndRefused(invalid_json(exc)) from None
            if self.body_type is not None:
                try:  # as FastAPI will (then again, to build the handler's argument)
                    self.body_type.validate_python(self._json, from_attributes=True)
                except ValidationError as exc:
                    raise ReadAndRefused(refusal(exc)) from None
        return self._json


class _AnyText(PathConvertor):
    """A path parameter of any characters: Starlette's `path` (`.*`) stops at a newline,
    and `/v1/calls/%0a/settle` was a bare 404 instead of a 422 naming call_id."""

    regex = "(?s:.*)"


register_url_convertor("anytext", _AnyText())
router = APIRouter(route_class=_Route)
OptionalSubject = Annotated[str | None, Query(min_length=1, max_length=256)]
ERRORS: dict[int | str, dict[str, object]] = {422: {"model": ErrorResponse}}
# Routes that take a body: one larger than RATEWARDEN_MAX_BODY_BYTES is a 413 (limits.py).
BODY_ERRORS: dict[int | str, dict[str, object]] = {
    **ERRORS,
    413: {"model": ErrorResponse, "description": "Body larger than RATEWARDEN_MAX_BODY_BYTES"},
}
CHECK_ERRORS: dict[int | str, dict[str, object]] = {**BODY_ERRORS, 409: {"model": ErrorResponse}}


def engine_of(app: Any) -> Engine:
    engine: Engine = app.state.engine
    return engine


def observer_of(app: Any) -> Observer:
    observer: Observer = app.state.observer
    return observer


async def decide(app: Any, body: CheckRequest) -> Decision:
    """Decide, then report the decision (metrics, audit); `args` only reach the audit.

    Shared with the hot path (hotpath.py), which calls it with the app from the ASGI scope.
    """
    engine = engine_of(app)
    policy = engine.policy
    call = to_call(body, policy.names, policy.tool_facts)  # `body.user` vouched for (vouch.py)
    started = time.perf_counter()
    decision = await engine.check(call)
    if policy.reads_args:
        decision.send_args = True  # so clients learn at once when a reload starts reading them
    observer_of(app).checked(decision, call, body.args, policy, time.perf_counter() - started)
    return decision


async def decide_batch(app: Any, body: BatchRequest) -> list[Decision] | JSONResponse:
    """Each call in order, all or nothing on its own; a conflicting call_id stops the batch.

    Shared with the hot path, which writes the decisions' JSON itself.
    """
    decisions = []
    for i, call in enumerate(body.calls):
        try:
            decisions.append(await decide(app, call))
        except CallIdConflict as exc:
            return conflict(exc, f"calls[{i}].call_id")
    return decisions


def conflict(exc: CallIdConflict, field: str = "call_id") -> JSONResponse:
    message = str(exc) if field == "call_id" else f"{field}: {exc}"
    return error_response(
        409, "call_id_conflict", message, [FieldError(field=field, message=str(exc))]
    )


CallIdPath = Annotated[
    str, Path(min_length=1, max_length=128), AfterValidator(no_control_characters)
]

# The two decision routes are served by the hot path (hotpath.py) whenever the body is
# valid JSON of the right shape; these handlers answer the rest (with FastAPI's
# validation errors) and give the OpenAPI schema its description of both.


@router.post("/v1/check", response_model=CheckResponse, responses=CHECK_ERRORS, tags=["decide"])
async def check(body: CheckRequest, request: Request) -> CheckResponse | JSONResponse:
    """Decide one call: allow, deny or ask, with the reason the model will read.

    Repeating a check with the same `call_id` before its settle returns the original
    answer of an allowed call and consumes nothing; after its settle it is a 409 (a
    finished call is not run again), as is the same `call_id` for another call. A
    refused call consumed nothing and is decided afresh.
    """
    vouched = vouch.check_for(vouch.caller_of(request.scope), body)
    if isinstance(vouched, JSONResponse):
        return vouched
    try:
        decision = await decide(request.app, vouched)
    except CallIdConflict as exc:
        return conflict(exc)
    return to_response(decision)


@router.post(
    "/v1/check/batch", response_model=BatchResponse, responses=CHECK_ERRORS, tags=["decide"]
)
async def check_batch(body: BatchRequest, request: Request) -> BatchResponse | JSONResponse:
    """Decide a model's parallel tool calls, in order; each call is all or nothing on its own."""
    vouched = vouch.batch_for(vouch.caller_of(request.scope), body)
    if isinstance(vouched, JSONResponse):
        return vouched
    decided = await decide_batch(request.app, vouched)
    if isinstance(decided, JSONResponse):
        return decided
    return BatchResponse(results=[to_response(d) for d in decided])


@router.post(
    SETTLE_PATH.format(call_id="{call_id:anytext}"),
    response_model=SettleResponse,
    response_model_exclude_none=True,  # `tokens`: a model call's alone
    responses={**BODY_ERRORS, 404: {"model": ErrorResponse}},
    tags=["decide"],
)
async def settle(
    call_id: CallIdPath, request: Request, body: SettleRequest | None = None
) -> SettleResponse | JSONResponse:
    """Report a finished call: charge its actual `cost` (default: its estimate), free its slots.

    Settling twice changes nothing; the second answer says `already_settled`. Only a
    token that could have checked the call settles it (a user token its own user's calls,
    a service token those of the users it vouches for, an admin token any): for any other,
    the call does not exist (404).
    """
    cost = body.cost if body else None
    result = body.result_digest if body else None
    usage = body.usage if body else None
    engine = engine_of(request.app)
    owner = vouch.may_settle(vouch.caller_of(request.scope))
    try:
        found = await engine.settle(call_id, cost, owner, result, usage)
    except StoreError as exc:
        return error_response(503, "store_unavailable", f"the store did not answer: {exc}")
    except NotAModelCall as exc:
        return error_response(
            422, "invalid_request", str(exc), [FieldError(field="usage", message=str(exc))]
        )
    observer_of(request.app).settled(found, engine.policy)
    if found.outcome == "unknown":
        message = (
            f"no allowed call {call_id!r} holds anything to settle "
            "(never checked, refused, or its record expired)"
        )
        return error_response(
            404, "unknown_call", message, [FieldError(field="call_id", message=message)]
        )
    return SettleResponse(
        call_id=call_id, outcome=found.outcome, charged=found.charged, tokens=found.tokens
    )


@router.post("/v1/admin/reset", response_model=ResetResponse, responses=BODY_ERRORS, tags=["admin"])
async def reset(body: ResetRequest, request: Request) -> ResetResponse | JSONResponse:
    """Clear a user's counters (every rule, or one `rule`), or one rule's for everyone.

    Audited (who, what, and the values forgotten) and counted (resets.py); a reset that
    names a user answers what its counters held (`forgotten`), read just before.
    """
    engine = engine_of(request.app)
    if body.user is None and body.rule is None:
        problem = "name a user, a rule, or both"
        return error_response(
            422, "invalid_request", problem, [FieldError(field="body", message=problem)]
        )
    if body.rule is not None and body.rule not in {r.name for r in engine.policy.rules}:
        problem = f"unknown rule {body.rule!r}"
        return error_response(
            422, "invalid_request", f"rule: {problem}", [FieldError(field="rule", message=problem)]
        )
    try:
        before = await resets.read_before(engine, body.user, body.rule)
        deleted = await engine.reset(body.user, body.rule)
    except StoreError as exc:
        return error_response(503, "store_unavailable", f"the store did not answer: {exc}")
    await request.app.state.fleet.announce_reset()  # every process forgets its refusals
    answer = ResetResponse(deleted=deleted, forgotten=before)
    metrics = observer_of(request.app).metrics
    return resets.recorded(metrics, engine, admin_name(request), (body.user, body.rule), answer)


@router.post("/v1/admin/reload", response_model=ReloadResponse, responses=ERRORS, tags=["admin"])
async def reload_policy(request: Request) -> ReloadResponse | JSONResponse:
    """Load the policy file again. An invalid file is refused whole (422 naming every error,
    `file:line: field: message`) and the policy in force stays; a valid one is swapped in
    at once. The worker that answers reloads now; every other worker of every daemon on
    the store reloads its own file at its next poll (service/fleet.py)."""
    reloader: PolicyReloader = request.app.state.reloader
    outcome = await reloader.reload("POST /v1/admin/reload")
    if outcome.tokens_error is not None and outcome.error is None:
        message = (
            f"policy version {outcome.current.version} in force; user tokens not reloaded, "
            f"the tokens in force stay: {outcome.tokens_error}"
        )
        field = FieldError(field="user_tokens", message=outcome.tokens_error)
        return error_response(422, "invalid_user_tokens", message, [field])
    if outcome.error is not None:
        lines = outcome.error.lines()
        fields = [
            FieldError(field=issue.field, message=line)
            for issue, line in zip(outcome.error.issues, lines, strict=True)
        ]
        message = (
            f"policy not reloaded; version {outcome.current.version} stays in force: "
            + "; ".join(lines)
        )
        return error_response(422, "invalid_policy", message, fields)
    return outcome.response()


@router.get("/v1/usage", response_model=UsageResponse, responses=ERRORS, tags=["inspect"])
async def usage(
    request: Request,
    user: OptionalSubject = None,
    tool: OptionalSubject = None,
    session: OptionalSubject = None,
    team: OptionalSubject = None,
) -> UsageResponse | JSONResponse:
    """A user's counters: used and remaining per rule, read without consuming anything.

    `user` is required, except with a user token (its own user, the only one it may read).
    """
    vouched = vouch.user_for(vouch.caller_of(request.scope), user)
    if isinstance(vouched, JSONResponse):
        return vouched
    user = vouched
    engine = engine_of(request.app)
    try:
        items = await engine.usage(user, tool, session, team)
    except StoreError as exc:
        return error_response(503, "store_unavailable", f"the store did not answer: {exc}")
    unshown = engine.policy.unshown_in_usage(user, tool, session, team)
    return UsageResponse(
        user=user,
        tool=tool,
        session=session,
        team=team,
        limits=[to_usage_item(i) for i in items],
        unshown=[UnshownRule(rule=name, needs=list(needs)) for name, needs in unshown],
    )


@router.get("/v1/denials", response_model=DenialsResponse, responses=ERRORS, tags=["inspect"])
async def denials(
    request: Request,
    user: OptionalSubject = None,
    tool: OptionalSubject = None,
    rule: Annotated[str | None, Query(min_length=1, max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=RECENT_LIMIT)] = 100,
) -> DenialsResponse | JSONResponse:
    """Recent denials, asks, shadow denials and approved asks, newest first (bounded).

    Each names the canonical `tool` and the host's own name for it (`host_tool`); `tool`
    finds entries by either."""
    try:
        found = await observer_of(request.app).audit.recent(user, tool, rule, limit)
    except StoreError as exc:
        return error_response(503, "store_unavailable", f"the store did not answer: {exc}")
    return DenialsResponse(denials=found)


@router.get("/metrics", tags=["health"], response_class=Response)
async def metrics(request: Request) -> Response:
    """Prometheus exposition."""
    answers = getattr(request.app, "answers", None)  # its HTTP answers, flushed first
    body, content_type = exposition(observer_of(request.app).metrics.registry, answers)
    return Response(body, media_type=content_type)


@router.get("/v1/policy", response_model=PolicyResponse, tags=["inspect"])
async def policy(request: Request) -> PolicyResponse:
    """The policy in force and its version hash."""
    current = engine_of(request.app).policy
    return PolicyResponse(version=current.version, source=current.source, policy=current.document)


@router.get("/v1/capabilities", response_model=Capabilities, tags=["inspect"])
async def capabilities(request: Request) -> Capabilities:
    """Whether the policy in force reads calls' `args`: a client asks before its first
    check, then keeps what every check answer says (`send_args`)."""
    current = engine_of(request.app).policy
    return Capabilities(policy_version=current.version, send_args=current.reads_args)


@router.get("/healthz", tags=["health"])
async def healthz(request: Request) -> dict[str, str]:
    """Liveness: the process answers (whatever the store does: a restart cannot mend Redis).
    `store` says whether the store answered a ping just now."""
    return {"status": "ok", "store": await _store_state(request)}


@router.get("/readyz", tags=["health"])
async def readyz(request: Request) -> dict[str, str]:
    """Readiness: this process gives answers, with the store or, while it is unreachable,
    by each rule's fail mode (`answering`). A Redis outage must not take every daemon out
    of its Service: the hosts would then follow their own fail mode, open by default,
    whatever the policy says."""
    store = await _store_state(request)
    answering = "store" if store == "ok" else "fail mode"
    return {"status": "ready", "policy": engine_of(request.app).policy.version,
            "store": store, "answering": answering}  # fmt: skip


async def _store_state(request: Request) -> str:
    """`ok`, or `unavailable: <why>`: one ping within the store timeout (or at once while
    the circuit is open), through the same guard as decisions."""
    try:
        await engine_of(request.app).store.ping()
    except StoreError as exc:
        return f"unavailable: {exc}"
    return "ok"
