"""Identity is a credential, not a claim (issue 25, items 3 and 4).

A user token (RATEWARDEN_USER_TOKENS) acts as its own user only: naming another user is a
403 naming `user` on every route that names one, and naming none is that user. A service
token (RATEWARDEN_API_TOKENS) vouches for the users it names, all of them or those
matching its globs (RATEWARDEN_API_TOKEN_USERS). A call is settled only by a credential
that could have checked it; any other settle is a 404 and changes nothing, on the
memory store, fakeredis and a real Redis.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ratewarden.clock import FakeClock
from ratewarden.store import Store
from tests.helpers.app import assert_error_shape, build_app, serving

ALICE = "alice-token-0123456789"
ALICE_2 = "alice-second-token-0123"
BOB = "bob-token-0123456789ab"
SERVICE = "svc-any-user-0123456789"
LIMITED = "svc-team-a-0123456789"
ADMIN = "adm-identity-0123456789"

POLICY = """\
version: 1
rules:
  - name: daily-spend
    per: [user]
    budget: 5.00/day
  - name: terminal-one-at-a-time
    match: {tool: terminal}
    per: [user]
    concurrency: 1
  - name: Bash-one-at-a-time
    match: {tool: Bash}
    per: [user]
    concurrency: 1
"""
TOKENS_FILE = f"""\
alice: [{ALICE}, {ALICE_2}]
bob: {BOB}
team-a-carol: team-a-carol-token-0123
"""


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@pytest.fixture
def tokens_file(tmp_path: Path) -> Path:
    path = tmp_path / "users.yaml"
    path.write_text(TOKENS_FILE)
    return path


def identity_app(tokens_file: Path, store: Store | None = None, **settings: Any) -> Any:
    return build_app(
        POLICY,
        store,
        api_tokens=[SERVICE, LIMITED],
        api_token_users=["*", "team-a-*"],
        admin_tokens=[ADMIN],
        user_tokens=tokens_file,
        reload_interval_s=0,
        **settings,
    )


@pytest.fixture(params=[True, False], ids=["hot", "fastapi"])
async def client(request: pytest.FixtureRequest, tokens_file: Path) -> AsyncIterator[Any]:
    app = identity_app(tokens_file, hot=request.param)
    async with serving(app) as served:
        yield served


async def spent(client: httpx.AsyncClient, user: str) -> tuple[float, float]:
    """(used, reserved) of the user's daily budget, read with the admin token."""
    answer = await client.get("/v1/usage", params={"user": user}, headers=bearer(ADMIN))
    assert answer.status_code == 200, answer.text
    [budget] = [item for item in answer.json()["limits"] if item["rule"] == "daily-spend"]
    return budget["used"], budget["reserved"]


def refused_naming(answer: httpx.Response, field: str = "user") -> None:
    assert answer.status_code == 403, answer.text
    body = answer.json()
    assert_error_shape(body)
    assert [f["field"] for f in body["fields"]] == [field]
    assert "user" in body["message"]
    assert ALICE not in answer.text  # the token is never echoed


# -- a user token acts as its user only ------------------------------------------------


async def test_a_user_token_naming_another_user_is_refused_on_every_route(
    client: httpx.AsyncClient,
) -> None:
    alice = bearer(ALICE)
    call = {"user": "bob", "tool": "search", "cost": 1}
    refused_naming(await client.post("/v1/check", json=call, headers=alice))
    refused_naming(await client.get("/v1/usage", params={"user": "bob"}, headers=alice))
    hook = {"user": "bob", "tool": "search", "call_id": "h1"}
    refused_naming(await client.post("/v1/hooks/claude-code/decision", json=hook, headers=alice))
    assert await spent(client, "bob") == (0, 0)  # nothing was spent in bob's name


async def test_a_batch_with_one_call_naming_another_user_is_refused_whole(
    client: httpx.AsyncClient,
) -> None:
    calls = [
        {"tool": "search", "cost": 1},
        {"user": "alice", "tool": "search", "cost": 1},
        {"user": "bob", "tool": "search", "cost": 1},
    ]
    answer = await client.post("/v1/check/batch", json={"calls": calls}, headers=bearer(ALICE))
    refused_naming(answer, "calls[2].user")
    # Refused before any call was decided: alice's own calls were not counted either.
    assert await spent(client, "alice") == (0, 0)
    assert await spent(client, "bob") == (0, 0)


async def test_a_user_token_naming_nobody_or_itself_acts_as_its_user(
    client: httpx.AsyncClient,
) -> None:
    alice = bearer(ALICE_2)  # either of alice's tokens
    first = await client.post("/v1/check", json={"tool": "search", "cost": 1}, headers=alice)
    assert first.json()["decision"] == "allow", first.text
    named = {"user": "alice", "tool": "search", "cost": 1}
    assert (await client.post("/v1/check", json=named, headers=alice)).json()["decision"] == "allow"
    batch = {"calls": [{"tool": "search", "cost": 1}, {"tool": "search", "cost": 1}]}
    assert (await client.post("/v1/check/batch", json=batch, headers=alice)).status_code == 200
    hook = {"tool": "search", "call_id": "h2"}
    decided = await client.post("/v1/hooks/claude-code/decision", json=hook, headers=alice)
    assert decided.json()["decision"] == "allow", decided.text
    # Every one of them was alice's, and her usage needs no ?user=.
    assert await spent(client, "alice") == (0, 4)
    own = await client.get("/v1/usage", headers=alice)
    assert own.status_code == 200, own.text
    assert own.json()["user"] == "alice"


@pytest.mark.parametrize(
    "named",
    ["Alice", "alice ", "ALICE", unicodedata.normalize("NFD", "alicé"), "alice\u200b"],
)
@pytest.mark.slow
async def test_names_are_exact_a_spelling_of_the_user_is_another_user(
    client: httpx.AsyncClient, named: str
) -> None:
    answer = await client.post(
        "/v1/check", json={"user": named, "tool": "search"}, headers=bearer(ALICE)
    )
    refused_naming(answer)


async def test_a_service_token_must_still_name_a_user(client: httpx.AsyncClient) -> None:
    for token in (SERVICE, ADMIN):
        answer = await client.post("/v1/check", json={"tool": "search"}, headers=bearer(token))
        assert answer.status_code == 422, answer.text
        assert [f["field"] for f in answer.json()["fields"]] == ["user"]
    usage = await client.get("/v1/usage", headers=bearer(SERVICE))
    assert usage.status_code == 422
    assert [f["field"] for f in usage.json()["fields"]] == ["user"]


async def test_a_service_token_vouches_for_anyone_and_a_limited_one_for_its_globs(
    client: httpx.AsyncClient,
) -> None:
    for user in ("bob", "team-a-dave", "anyone at all"):
        answer = await client.post(
            "/v1/check", json={"user": user, "tool": "search"}, headers=bearer(SERVICE)
        )
        assert answer.json()["decision"] == "allow", answer.text
    limited = bearer(LIMITED)
    ok = await client.post("/v1/check", json={"user": "team-a-dave", "tool": "s"}, headers=limited)
    assert ok.json()["decision"] == "allow", ok.text
    refused_naming(
        await client.post("/v1/check", json={"user": "bob", "tool": "s"}, headers=limited)
    )
    refused_naming(await client.get("/v1/usage", params={"user": "bob"}, headers=limited))
    mixed = {"calls": [{"user": "team-a-x", "tool": "s"}, {"user": "team-b-y", "tool": "s"}]}
    refused_naming(
        await client.post("/v1/check/batch", json=mixed, headers=limited), "calls[1].user"
    )


async def test_admin_endpoints_stay_admin_only_for_a_user_token(
    client: httpx.AsyncClient,
) -> None:
    for method, path in (
        ("GET", "/v1/denials"),
        ("GET", "/v1/policy"),
        ("POST", "/v1/admin/reload"),
    ):
        answer = await client.request(method, path, headers=bearer(ALICE))
        assert answer.status_code == 403, (path, answer.text)


# -- the HTTP hook: the host's own deny form --------------------------------------------


def claude(event: str, tool_use_id: str) -> bytes:
    payload = {
        "hook_event_name": event,
        "tool_name": "Bash",
        "tool_input": {"command": "ls"},
        "tool_use_id": tool_use_id,
        "session_id": "s1",
    }
    return json.dumps(payload).encode()


def permission(answer: httpx.Response) -> str:
    assert answer.status_code == 200, answer.text  # a host runs the call on an error status
    if not answer.content:
        return "allow"
    decision: str = answer.json()["hookSpecificOutput"]["permissionDecision"]
    return decision


async def test_an_http_hook_naming_another_user_is_denied_in_the_hosts_form(
    client: httpx.AsyncClient,
) -> None:
    alice = bearer(ALICE)
    answer = await client.post(
        "/v1/hooks/claude-code?user=bob", content=claude("PreToolUse", "t1"), headers=alice
    )
    assert permission(answer) == "deny"
    reason = answer.json()["hookSpecificOutput"]["permissionDecisionReason"]
    assert "user" in reason
    assert ALICE not in answer.text
    # Naming nobody: alice, whose one Bash slot this call now holds.
    own = await client.post(
        "/v1/hooks/claude-code", content=claude("PreToolUse", "t2"), headers=alice
    )
    assert permission(own) == "allow"
    second = await client.post(
        "/v1/hooks/claude-code?user=alice", content=claude("PreToolUse", "t3"), headers=alice
    )
    assert permission(second) == "deny"  # her slot is taken: it was her call
    bobs = await client.post(
        "/v1/hooks/claude-code", content=claude("PreToolUse", "t4"), headers=bearer(BOB)
    )
    assert permission(bobs) == "allow"  # bob's slot is his own


# -- settling: only a credential that could have checked the call ---------------------


@pytest.fixture
async def on_store(
    store: Store, clock: FakeClock, tokens_file: Path
) -> AsyncIterator[httpx.AsyncClient]:
    """The app on each store kind (memory, fakeredis, a real redis-server)."""
    async with serving(identity_app(tokens_file, store)) as served:
        yield served


async def alices_call(client: httpx.AsyncClient, call_id: str) -> None:
    body = {"tool": "terminal", "call_id": call_id, "cost": 1}
    answer = await client.post("/v1/check", json=body, headers=bearer(ALICE))
    assert answer.json()["decision"] == "allow", answer.text


async def settle(client: httpx.AsyncClient, call_id: str, token: str) -> httpx.Response:
    return await client.post(
        f"/v1/calls/{call_id}/settle", json={"cost": 4.5}, headers=bearer(token)
    )


async def test_a_call_is_not_settled_by_another_users_token_and_stays_as_it_was(
    on_store: httpx.AsyncClient,
) -> None:
    client = on_store
    await alices_call(client, "c1")
    for token in (BOB, LIMITED):  # another user; a service token not vouching for alice
        answer = await settle(client, "c1", token)
        assert answer.status_code == 404, answer.text
        never = await settle(client, "c1-never-checked", token)
        # As if the call did not exist: the same answer as for an id never checked.
        assert answer.json()["message"] == never.json()["message"].replace("c1-never-checked", "c1")
    assert await spent(client, "alice") == (0, 1)  # still reserved at its estimate
    busy = await client.post("/v1/check", json={"tool": "terminal"}, headers=bearer(ALICE))
    assert busy.json()["decision"] == "deny"  # her slot is still held
    mine = await settle(client, "c1", ALICE)
    assert mine.json()["outcome"] == "settled", mine.text
    assert await spent(client, "alice") == (4.5, 0)


@pytest.mark.parametrize("token", [ALICE_2, SERVICE, ADMIN])
async def test_a_call_is_settled_by_its_users_token_an_unrestricted_service_or_an_admin(
    on_store: httpx.AsyncClient, token: str
) -> None:
    await alices_call(on_store, "c2")
    answer = await settle(on_store, "c2", token)
    assert answer.status_code == 200, answer.text
    assert answer.json()["outcome"] == "settled"
    assert await spent(on_store, "alice") == (4.5, 0)


async def test_a_limited_service_token_settles_the_calls_of_its_users(
    on_store: httpx.AsyncClient,
) -> None:
    body = {"user": "team-a-dave", "tool": "terminal", "call_id": "c3", "cost": 1}
    checked = await on_store.post("/v1/check", json=body, headers=bearer(SERVICE))
    assert checked.json()["decision"] == "allow"
    assert (await settle(on_store, "c3", BOB)).status_code == 404
    answer = await settle(on_store, "c3", LIMITED)
    assert answer.json()["outcome"] == "settled", answer.text


async def test_the_hooks_settle_only_their_own_users_calls(
    on_store: httpx.AsyncClient,
) -> None:
    client, alice, bob = on_store, bearer(ALICE), bearer(BOB)
    pre = await client.post(
        "/v1/hooks/claude-code", content=claude("PreToolUse", "k1"), headers=alice
    )
    assert permission(pre) == "allow"
    # Bob's HTTP hook and bob's command hook both report alice's call finished: no effect.
    post = await client.post(
        "/v1/hooks/claude-code", content=claude("PostToolUse", "k1"), headers=bob
    )
    assert permission(post) == "allow"
    done = {"finished": True, "call_id": "k1", "cost": 4.5}
    noted = await client.post("/v1/hooks/claude-code/decision", json=done, headers=bob)
    assert "could not settle" in " ".join(noted.json()["notes"])
    again = await client.post(
        "/v1/hooks/claude-code", content=claude("PreToolUse", "k2"), headers=alice
    )
    assert permission(again) == "deny"  # alice's slot is still held by k1
    await client.post("/v1/hooks/claude-code", content=claude("PostToolUse", "k1"), headers=alice)
    freed = await client.post(
        "/v1/hooks/claude-code", content=claude("PreToolUse", "k3"), headers=alice
    )
    assert permission(freed) == "allow"


# -- the file is read again on reload -----------------------------------------------------


async def test_a_reload_reads_the_tokens_again_and_a_bad_file_keeps_those_in_force(
    tokens_file: Path,
) -> None:
    async with serving(identity_app(tokens_file)) as client:
        tokens_file.write_text(f"alice: {ALICE}\nbob: {ALICE}\n")  # a shared token: a mistake
        refused = await client.post("/v1/admin/reload", headers=bearer(ADMIN))
        assert refused.status_code == 422, refused.text
        assert [f["field"] for f in refused.json()["fields"]] == ["user_tokens"]
        assert "share a token" in refused.json()["message"]
        assert str(tokens_file) in refused.json()["message"]
        assert ALICE not in refused.text
        still = await client.post("/v1/check", json={"tool": "search"}, headers=bearer(BOB))
        assert still.json()["decision"] == "allow"  # the tokens in force stay
        tokens_file.write_text(f"alice: {ALICE}\n")  # bob's token revoked
        assert (await client.post("/v1/admin/reload", headers=bearer(ADMIN))).status_code == 200
        gone = await client.post("/v1/check", json={"tool": "search"}, headers=bearer(BOB))
        assert gone.status_code == 401
