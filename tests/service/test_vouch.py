"""service/vouch.py's `check_in`, the hot path's one call, answers exactly as
`check_for(caller_of(scope), body)` does, for every kind of caller and body."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.responses import JSONResponse

from ratewarden.service import vouch
from ratewarden.service.auth import ANYONE, Caller
from ratewarden.wire.bodies import CheckRequest

SCOPES: dict[str, dict[str, Any]] = {
    "no state": {},
    "empty state": {"state": {}},
    "state without a caller": {"state": {"other": 1}},
    "anyone": {"state": {"caller": ANYONE}},
    "alice's user token": {"state": {"caller": Caller(user="alice")}},
    "a service token for team-*": {"state": {"caller": Caller(globs=("team-*",))}},
    "not a Caller": {"state": {"caller": "alice"}},
}
BODIES = {
    "alice": {"user": "alice", "tool": "t"},
    "bob": {"user": "bob", "tool": "t"},
    "team-x": {"user": "team-x", "tool": "t"},
    "nobody": {"tool": "t"},
}


@pytest.mark.parametrize("scope", SCOPES.values(), ids=list(SCOPES))
@pytest.mark.parametrize("fields", BODIES.values(), ids=list(BODIES))
def test_check_in_is_check_for_the_scopes_caller(
    scope: dict[str, Any], fields: dict[str, str]
) -> None:
    body = CheckRequest.model_validate(fields)
    expected = vouch.check_for(vouch.caller_of(scope), body)
    found = vouch.check_in(scope, body)
    if isinstance(expected, JSONResponse):
        assert isinstance(found, JSONResponse)
        assert (found.status_code, found.body) == (expected.status_code, expected.body)
    else:
        assert found == expected
        assert (found is body) == (expected is body)  # no copy where check_for makes none
