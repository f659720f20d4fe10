"""The daemon's side of the hooks (ratewarden.hooks): a host's own HTTP hook, answered in
its own terms, and the decisions `ratewarden hook HOST` asks for.

- `POST /v1/hooks/{host}/decision`: the command hook's. It read the host's payload
  itself (so it can answer when the daemon cannot) and sends the event (`HookEvent`);
  the answer is the decision, the message and notes for its log (`HookDecision`).
- `POST /v1/hooks/{host}`: a host that can post its hook payload to a URL (Claude Code's
  `http` hooks, agent-code's HTTP hooks) gets the answer it reads: no process per tool
  call. Who calls comes from the query (`?user=alice&team=a`), as do what the host keeps
  out of its payload (agent-code's `tool`); `fail=closed` makes a payload that cannot be
  read a refusal rather than a hook error. Its body has a cap of its own
  (RATEWARDEN_MAX_HOOK_BODY_BYTES, 128 KiB: the tool's input, say a file being
  written), holds no more items than any body (wire.MAX_ITEMS, counted on its
  bytes before it is read), and past either is refused as too large to check.

Either way the same steps follow, here: the names and ids are made acceptable
(wire/names.py), the call is checked (its `args` when the policy reads them) or
settled, and a call id the host reused is checked as a new call: the daemon replays an
allowed id without counting it, and a host that reuses ids must not get free calls.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Annotated, Any
from urllib.parse import parse_qsl

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import Scope

from ratewarden.engine import CallIdConflict, Decision
from ratewarden.engine.decision import detail_line
from ratewarden.hooks.contract import BadInput, HookOutput, Host, PostCall, PreCall
from ratewarden.hooks.hosts import HOSTS
from ratewarden.http.limits import HOOK_PATHS
from ratewarden.service import routes, vouch
from ratewarden.service.auth import Caller
from ratewarden.service.errors import error_response
from ratewarden.store import StoreError
from ratewarden.vocabulary import NOT_VOUCHED, TOO_LARGE, UNREADABLE, FailMode
from ratewarden.wire.bodies import (
    ErrorResponse,
    FieldError,
    HookDecision,
    HookEvent,
    Violation,
)
from ratewarden.wire.bounded import TooManyItems, too_many_items
from ratewarden.wire.names import check_request, usable_call_id

router = APIRouter(tags=["hooks"])
UNKNOWN_CALL = (
    "no allowed call by that id holds anything to settle (never checked, refused, or expired)"
)
MAX_HOOK_TEXT = 4096
HookText = Annotated[str | None, Query(min_length=1, max_length=MAX_HOOK_TEXT)]


@router.post(
    "/v1/hooks/{host}/decision",
    response_model=HookDecision,
    responses={**routes.BODY_ERRORS, 404: {"model": ErrorResponse}},
)
async def decision(host: str, body: HookEvent, request: Request) -> HookDecision | JSONResponse:
    """The decision on a hook event `ratewarden hook HOST` read from its host's payload.

    Who calls: a user token's user (`user`, if given, must be that user, else a 403); with
    a service token, `user`, else the hook's `default_user`.
    """
    if host not in HOSTS:
        return _unknown_host(host)
    caller = vouch.caller_of(request.scope)
    if body.finished:
        if body.call_id is None:
            return _missing("call_id", "a finished call names its call_id")
        if body.user is not None and not caller.may_act_for(body.user):
            return vouch.forbidden(caller, "user")  # as a check naming them would be
        done = PostCall(body.call_id, body.status, body.duration_ms, body.cost, body.result_digest)
        return await settle(request.app, done, vouch.may_settle(caller))
    if body.tool is None:
        return _missing("tool", "a call about to run names its tool")
    named = body.user if body.user is not None or caller.user else body.default_user
    user = vouch.user_for(caller, named)
    if isinstance(user, JSONResponse):
        return user
    call = PreCall(body.tool, body.session, body.call_id, body.args)
    return await check(request.app, call, user, body.team, body.args_cut, host=host)


@router.post(
    "/v1/hooks/{host}",
    responses={
        200: {"description": "the host's own answer (for Claude Code: empty, or its JSON)"},
        400: {"description": "a payload that cannot be read, failing open: a hook error"},
        403: {"description": "agent-code: the call is vetoed (the body is the reason)"},
        404: {"model": ErrorResponse},
        413: {"model": ErrorResponse, "description": "over RATEWARDEN_MAX_HOOK_BODY_BYTES"},
        422: {"model": ErrorResponse},
    },
)
async def native(
    host: str,
    request: Request,
    user: HookText = None,
    team: HookText = None,
    fail: FailMode = FailMode.OPEN,
) -> Response:
    """A host's own HTTP hook: its payload in, the answer it reads out (docs/integrations.md).

    With a user token the URL need not name the user; one naming another user is
    refused in the host's own deny form (a host runs the call on an error status).
    Valid requests are answered by the hot path (`answer`, from service/hotpath.py)
    before they reach FastAPI; this route answers the rest and describes it in OpenAPI.
    """
    payload = await request.body()
    query = request.query_params
    return await answer(request.app, request.scope, host, query, payload, user, team, fail)


async def answer(
    app: Any,
    scope: Scope,
    host: str,
    query: Mapping[str, str],
    payload: bytes,
    user: str | None,
    team: str | None,
    fail: FailMode,
) -> Response:
    """The host's answer to its hook payload; `user`, `team` and `fail` as the URL says."""
    found = HOSTS.get(host)
    if found is None or found.http is None:
        return _unknown_host(host, http=True)
    context = {name: query.get(key, "") for key, name in found.context.items()}
    for key, name in found.context.items():
        if not context[name]:  # the host keeps it out of its payload: the URL must say it
            return _missing(key, f"the hook's URL must name it (?{key}=...)", query=True)
    if too_many_items(payload):  # as for every body: counted on its bytes, not read
        # Refused whatever the fail mode: failing open, padding would pass any rule.
        refused = TOO_LARGE.format(reason=TooManyItems().args[0])
        return _http(found, HookDecision(decision="deny", message=refused))
    try:
        event = found.read(payload, context)
    except BadInput as exc:
        return _http(found, _unreadable(found, fail, str(exc)))
    if event is None:
        return _http(found, None)
    caller = vouch.caller_of(scope)
    if isinstance(event, PostCall):
        return _http(found, await settle(app, event, vouch.may_settle(caller)))
    if not isinstance(event, PreCall):  # a model call: only `ratewarden hook gemini` asks
        return _http(found, None)
    return await _native_check(app, found, event, caller, user, team)


def plain_query(scope: Scope) -> tuple[dict[str, str], str | None, str | None, FailMode] | None:
    """The hook URL's query when `native`'s own parameters would take it as it is: the
    query, `user`, `team` and `fail`; None for anything FastAPI would refuse or read
    otherwise (an empty or too long name, an unknown fail mode, a repeated key), which
    the hot path hands to FastAPI for its exact answer."""
    pairs = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    query = dict(pairs)
    if len(query) != len(pairs):
        return None
    user, team = query.get("user"), query.get("team")
    if any(name is not None and not 0 < len(name) <= MAX_HOOK_TEXT for name in (user, team)):
        return None
    fail = query.get("fail", FailMode.OPEN.value)
    if fail not in _FAIL_MODES:
        return None
    return query, user, team, FailMode(fail)


_FAIL_MODES = frozenset(mode.value for mode in FailMode)


async def _native_check(
    app: Any, host: Host, event: PreCall, caller: Caller, user: str | None, team: str | None
) -> Response:
    """An HTTP hook's call about to run, as the user its token vouches for (vouch.py)."""
    who = user or (event.user if caller.user is None else None)  # the host's: a default
    if who is None and caller.user is None:
        return _missing("user", "who calls: ?user=NAME in the hook's URL", query=True)
    vouched = vouch.user_for(caller, who)
    if isinstance(vouched, JSONResponse):
        refused = NOT_VOUCHED.format(field="?user=" if user else "the host's user")
        return _http(host, HookDecision(decision="deny", message=refused))
    return _http(host, await check(app, event, vouched, team, host=host.name))


async def check(
    app: Any,
    call: PreCall,
    user: str,
    team: str | None,
    args_cut: list[str] | None = None,
    *,
    host: str,
) -> HookDecision:
    """Check a call about to run, in its `host`'s names (the daemon maps them to the
    canonical ones: convert.to_call); a reused call id is checked again as a new call."""
    engine = routes.engine_of(app)
    reads = engine.policy.reads_args
    request = check_request(
        user=user,
        tool=call.tool,
        session=call.session,
        team=team,
        call_id=call.call_id,
        args=call.args if reads else None,
        args_cut=(args_cut or []) if reads else (),
        host=host,
    )
    notes: list[str] = []
    decided: Decision | None = None
    with contextlib.suppress(CallIdConflict):  # the id is another call's: a new call
        decided = await routes.decide(app, request)
    if decided is None or decided.replayed:
        notes.append(f"call id {request.call_id} was already used; checked as a new call")
        decided = await routes.decide(app, request.model_copy(update={"call_id": None}))
    return _answer(decided, notes)


def _answer(decided: Decision, notes: list[str]) -> HookDecision:
    """A decision as a hook's answer; a refusal with its detail (docs/api.md)."""
    if decided.allowed or not decided.violations:
        return HookDecision(decision=decided.decision, message=decided.message, notes=notes)
    worded = next((v for v in decided.violations if v.message == decided.message), None)
    return HookDecision(
        decision=decided.decision,
        message=decided.message,
        notes=notes,
        retry_after=decided.retry_after,
        violations=[Violation.model_validate(v, from_attributes=True) for v in decided.violations],
        detail=detail_line(worded or decided.violations[0]),
    )


async def settle(
    app: Any, call: PostCall, may_settle: Callable[[str], bool] | None = None
) -> HookDecision:
    """Settle a finished call; one the daemon does not know (or the caller may not settle:
    vouch.py) is a note, not an error."""
    engine = routes.engine_of(app)
    call_id = usable_call_id(call.call_id)
    try:
        found = await engine.settle(call_id, call.cost, may_settle, call.result_digest)
    except StoreError as exc:
        return HookDecision(decision="allow", notes=[f"could not settle {call_id}: {exc}"])
    routes.observer_of(app).settled(found, engine.policy)
    notes = [] if found.outcome != "unknown" else [f"could not settle {call_id}: {UNKNOWN_CALL}"]
    return HookDecision(decision="allow", notes=notes)


def refuse_too_large(path: str, problem: str) -> tuple[int, str, bytes] | None:
    """A host's own refusal of a call whose hook body is over the cap (the body cap's
    `hook_refusal`), or None for any other path. Refused, never passed: padding a call
    past the cap must not run it."""
    if not path.startswith(HOOK_PATHS) or path.endswith("/decision"):
        return None
    host = HOSTS.get(path.removeprefix(HOOK_PATHS))
    if host is None or host.http is None:
        return None
    sent = host.http(host.refuse("deny", TOO_LARGE.format(reason=f"body {problem}"), ""))
    return sent.status, sent.media_type, sent.body.encode()


def _unreadable(host: Host, fail: FailMode, reason: str) -> HookDecision | str:
    """A payload that cannot be read: a hook error failing open, a refusal failing closed."""
    if fail == FailMode.OPEN:
        return f"ratewarden: {reason}; failing open"
    return HookDecision(decision="deny", message=UNREADABLE.format(host=host.name, reason=reason))


def _http(host: Host, answer: HookDecision | str | None) -> Response:
    """`answer` as the host's HTTP hook reads it (a str: a hook error)."""
    assert host.http is not None
    if isinstance(answer, str):
        output = HookOutput(code=host.unreadable_open_code, stderr=(answer,))
    elif answer is None or answer.decision == "allow":
        output = host.allow
    else:
        output = host.refuse(answer.decision, answer.message, answer.detail)
    sent = host.http(output)
    return Response(sent.body, status_code=sent.status, media_type=sent.media_type)


def _unknown_host(host: str, http: bool = False) -> JSONResponse:
    known = sorted(name for name, h in HOSTS.items() if h.http is not None or not http)
    message = f"no {'HTTP ' if http else ''}hook for {host!r}; known: {', '.join(known)}"
    return error_response(404, "unknown_host", message, [FieldError(field="host", message=message)])


def _missing(field: str, message: str, query: bool = False) -> JSONResponse:
    where = f"query.{field}" if query else field
    text = f"{where}: {message}"
    return error_response(422, "invalid_request", text, [FieldError(field=where, message=message)])
