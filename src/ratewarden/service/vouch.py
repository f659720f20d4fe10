"""Who a request acts as: the one home of the rule that identity is a credential, not a claim.

The token (service/auth.py's `Caller`, in the request's scope) says whom the request
may act as; the body or the query only names someone within that:

- a user token acts as its own user: a request naming no user is that user, one naming
  another user is refused (403, naming the field);
- a service token vouches for the users its request names (a gateway that authenticated
  them): any user, or only those matching its globs; it must name one (422, as before);
- an admin token, and a daemon without tokens (loopback only), act for anyone.

Settling follows the same rule (`may_settle`): a call is settled only by a credential that
could have checked it, and any other settle is answered as for a call that does not exist.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fastapi.responses import JSONResponse

from ratewarden.service.auth import ANYONE, Caller
from ratewarden.service.errors import error_response
from ratewarden.wire.bodies import BatchRequest, CheckRequest, FieldError

MISSING = "required field is missing"  # as errors.py words pydantic's `missing`


def caller_of(scope: Mapping[str, Any]) -> Caller:
    """Whom the request's token vouches for (auth.py puts it in the scope's state)."""
    state = scope.get("state")
    found = state.get("caller") if state else None
    return found if isinstance(found, Caller) else ANYONE


def may_settle(caller: Caller) -> Callable[[str], bool] | None:
    """Who may settle a call, by the call's user; None: anyone (no check to make)."""
    return None if caller is ANYONE else caller.may_act_for


def user_for(caller: Caller, named: str | None, field: str = "user") -> str | JSONResponse:
    """The user a request acts as, or the answer refusing it."""
    if named is None:
        if caller.user is not None:
            return caller.user
        return missing(field)
    if not caller.may_act_for(named):
        return forbidden(caller, field)
    return named


def check_for(
    caller: Caller, body: CheckRequest, field: str = "user"
) -> CheckRequest | JSONResponse:
    """`body` acting as its vouched-for user (filled in when it named none), or the refusal."""
    if body.user is not None and caller is ANYONE:
        return body  # the usual case: nothing to check, nothing to copy
    user = user_for(caller, body.user, field)
    if isinstance(user, JSONResponse):
        return user
    return body if user == body.user else body.model_copy(update={"user": user})


def check_in(scope: Mapping[str, Any], body: CheckRequest) -> CheckRequest | JSONResponse:
    """`check_for(caller_of(scope), body)` in one call, for the hot path: a request no
    token vouches for (no tokens: loopback) that names its user is taken as it is."""
    state = scope.get("state")
    found = state.get("caller") if state else None
    if found is None and body.user is not None:
        return body  # caller_of's ANYONE, and check_for's usual case
    return check_for(found if isinstance(found, Caller) else ANYONE, body)


def batch_for(caller: Caller, body: BatchRequest) -> BatchRequest | JSONResponse:
    """Every call of the batch vouched for before any is decided: one call naming another
    user refuses the whole batch, and nothing was counted."""
    calls = []
    for i, call in enumerate(body.calls):
        vouched = check_for(caller, call, f"calls[{i}].user")
        if isinstance(vouched, JSONResponse):
            return vouched
        calls.append(vouched)
    if all(new is old for new, old in zip(calls, body.calls, strict=True)):
        return body
    return body.model_copy(update={"calls": calls})


def forbidden(caller: Caller, field: str) -> JSONResponse:
    problem = f"{caller.who()}; a request cannot name another user"
    return error_response(
        403, "forbidden", f"{field}: {problem}", [FieldError(field=field, message=problem)]
    )


def missing(field: str) -> JSONResponse:
    """The 422 a service token's request gets without a user (as before user tokens)."""
    return error_response(
        422, "invalid_request", f"{field}: {MISSING}", [FieldError(field=field, message=MISSING)]
    )
