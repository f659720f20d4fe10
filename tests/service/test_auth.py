"""Bearer-token auth: every endpoint against every kind of caller, tokens from the
environment and from flags, and the rule that a daemon without tokens stays on loopback.

The table test drives the app in-process; the last tests run `ratewarden serve` as a
real process (one with two workers on a real redis-server, whose workers get the tokens
through the environment)."""

from __future__ import annotations

import contextlib
import hmac
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from ratewarden.cli import main
from ratewarden.clock import FakeClock
from ratewarden.service import auth
from ratewarden.service.app import create_app
from ratewarden.service.settings import Settings
from ratewarden.store import MemoryStore
from tests.helpers.app import assert_error_shape, serving
from tests.helpers.daemon import Daemon, clean_environment, running_daemon
from tests.helpers.redis_server import RedisServer, free_port

CHECK_TOKEN = "chk-0123456789abcdef"
ADMIN_TOKEN = "adm-fedcba9876543210"
VIEWER_TOKEN = "vwr-5a4b3c2d1e0f9a8b"
BAD_TOKEN = "chk-0123456789abcdeX"  # one character off a real one

POLICY = """\
version: 1
rules:
  - name: terminal-per-minute
    match: {tool: terminal}
    rate: 100/minute
  - name: daily-spend
    budget: 5.00/day
"""

# Each endpoint, with a request it accepts once past auth.
ENDPOINTS: dict[str, dict[str, Any]] = {
    "POST /v1/check": {"json": {"user": "u", "tool": "terminal"}},
    "POST /v1/check/batch": {"json": {"calls": [{"user": "u", "tool": "terminal"}]}},
    "POST /v1/calls/c-1/settle": {"json": {"cost": 0.05}},
    "GET /v1/usage": {"params": {"user": "u"}},
    "GET /v1/denials": {},
    "GET /v1/policy": {},
    "POST /v1/admin/reset": {"json": {"user": "nobody"}},
    "POST /v1/admin/reload": {},
    "GET /v1/admin/stats": {},
    "GET /v1/admin/blocked": {"params": {"window": "1h"}},
    "GET /v1/admin/activity": {"params": {"user": "u"}},
    "GET /v1/admin/overrides": {},
    "POST /v1/admin/overrides": {
        "json": {
            "users": ["nobody"],
            "rule": "terminal-per-minute",
            "rate": "5/minute",
            "ttl": "10m",
            "reason": "auth table",
        }
    },
    "DELETE /v1/admin/overrides/ovr_none": {},
    "GET /v1/capabilities": {},
    "GET /v1/whoami": {},
    "GET /console": {},
    "GET /healthz": {},
    "GET /readyz": {},
    "GET /metrics": {},
    "GET /docs": {},
    "GET /redoc": {},
    "GET /openapi.json": {},
}
# The expected status of each endpoint for each caller.
EXPECTED = """
endpoint                    none  bad   check  viewer  admin
POST /v1/check              401   401   200    403     200
POST /v1/check/batch        401   401   200    403     200
POST /v1/calls/c-1/settle   401   401   200    403     200
GET /v1/usage               401   401   200    200     200
GET /v1/denials             401   401   403    200     200
GET /v1/policy              401   401   403    200     200
POST /v1/admin/reset        401   401   403    403     200
POST /v1/admin/reload       401   401   403    403     200
GET /v1/admin/stats         401   401   403    200     200
GET /v1/admin/blocked       401   401   403    200     200
GET /v1/admin/activity      401   401   403    200     200
GET /v1/admin/overrides     401   401   403    200     200
POST /v1/admin/overrides    401   401   403    403     201
DELETE /v1/admin/overrides/ovr_none  401   401   403    403     404
GET /v1/capabilities        401   401   200    403     200
GET /v1/whoami              401   401   200    200     200
GET /console                200   200   200    200     200
GET /healthz                200   200   200    200     200
GET /readyz                 200   200   200    200     200
GET /metrics                200   200   200    200     200
GET /docs                   200   200   200    200     200
GET /redoc                  307   307   307    307     307
GET /openapi.json           200   200   200    200     200
"""
CALLERS = {
    "none": {},
    "bad": {"authorization": f"Bearer {BAD_TOKEN}"},
    "check": {"authorization": f"Bearer {CHECK_TOKEN}"},
    "viewer": {"authorization": f"Bearer {VIEWER_TOKEN}"},
    "admin": {"authorization": f"Bearer {ADMIN_TOKEN}"},
}


@pytest.fixture(autouse=True)
def no_ratewarden_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RATEWARDEN_"):
            monkeypatch.delenv(name)


def settings_for(policy: Path, **values: Any) -> Settings:
    return Settings(store_url="memory://", policy=policy, reload_interval_s=0, **values)


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY)
    return path


@pytest.fixture
async def guarded(policy_file: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The app with one check token, one viewer token and one admin token."""
    settings = settings_for(
        policy_file,
        api_tokens=[CHECK_TOKEN],
        admin_tokens=[ADMIN_TOKEN],
        viewer_tokens=[VIEWER_TOKEN],
    )
    app = create_app(settings, store=MemoryStore(FakeClock()))
    async with serving(app) as client:
        yield client


def expected_table() -> dict[tuple[str, str], int]:
    header, *rows = [line.split() for line in EXPECTED.strip().splitlines()]
    callers = header[1:]
    return {
        (f"{row[0]} {row[1]}", caller): int(status)
        for row in rows
        for caller, status in zip(callers, row[2:], strict=True)
    }


async def test_every_endpoint_for_every_caller(guarded: httpx.AsyncClient) -> None:
    # A call holding a reservation, so that settling it is a 200 (twice: settled, then
    # already settled).
    held = await guarded.post(
        "/v1/check",
        json={"user": "u", "tool": "terminal", "call_id": "c-1", "cost": 0.1},
        headers=CALLERS["admin"],
    )
    assert held.json()["decision"] == "allow"
    assert set(ENDPOINTS) == {endpoint for endpoint, _ in expected_table()}

    actual: dict[tuple[str, str], int] = {}
    for endpoint, request in ENDPOINTS.items():
        method, path = endpoint.split(" ")
        for caller, headers in CALLERS.items():
            response = await guarded.request(method, path, headers=headers, **request)
            actual[(endpoint, caller)] = response.status_code
            if response.status_code == 401:
                assert_error_shape(response.json())
                assert response.json()["error"] == "unauthorized"
                assert response.headers["www-authenticate"].startswith('Bearer realm="ratewarden"')
            elif response.status_code == 403:
                assert_error_shape(response.json())
                assert response.json()["error"] == "forbidden"
                message = response.json()["message"]
                assert "admin token" in message  # what the endpoint needs, admin always
                assert f"a {caller} token" in message  # and what this role may do
    assert actual == expected_table()


async def test_a_viewer_is_told_what_it_may_do(guarded: httpx.AsyncClient) -> None:
    """The 403 names the role, what the endpoint needs and what the role may do."""
    viewer = CALLERS["viewer"]
    reset = await guarded.post("/v1/admin/reset", json={"user": "u"}, headers=viewer)
    assert reset.json()["message"] == (
        "this endpoint needs an admin token; a viewer token may only read (stats, usage, "
        "refusals, the policy and runtime overrides): it cannot check, settle, reset, "
        "override or reload"
    )
    assert reset.headers["www-authenticate"] == (
        'Bearer realm="ratewarden", error="insufficient_scope"'
    )
    check = await guarded.post("/v1/check", json={"user": "u", "tool": "t"}, headers=viewer)
    assert check.json()["message"].startswith("this endpoint needs a check or admin token; ")
    denials = await guarded.get("/v1/denials", headers=CALLERS["check"])
    assert denials.json()["message"].startswith("this endpoint needs a viewer or admin token; ")
    # A method the path does not list asks for admin, as an unlisted path does.
    put = await guarded.put("/v1/admin/overrides", json={}, headers=viewer)
    assert put.status_code == 403
    assert (await guarded.head("/v1/admin/overrides", headers=viewer)).status_code != 403
    # Reading a user's usage names the user, as for a service token.
    usage = await guarded.get("/v1/usage", params={"user": "u"}, headers=viewer)
    assert usage.json()["user"] == "u"
    assert (await guarded.get("/v1/usage", headers=viewer)).status_code == 422


async def test_whoami_names_the_role(guarded: httpx.AsyncClient, policy_file: Path) -> None:
    roles = {}
    for caller in ("check", "viewer", "admin"):
        roles[caller] = (await guarded.get("/v1/whoami", headers=CALLERS[caller])).json()
    assert roles == {
        "check": {"role": "check", "name": None},
        "viewer": {"role": "viewer", "name": None},
        "admin": {"role": "admin", "name": "admin token 1"},
    }
    # Auth off (loopback only): whoever asks may do everything.
    async with serving(create_app(settings_for(policy_file), store=MemoryStore(FakeClock()))) as c:
        assert (await c.get("/v1/whoami")).json() == {"role": "admin", "name": None}


async def test_missing_and_invalid_tokens_are_told_apart(guarded: httpx.AsyncClient) -> None:
    missing = await guarded.get("/v1/usage", params={"user": "u"})
    assert missing.json() == {
        "error": "unauthorized",
        "message": "missing bearer token: send the header `Authorization: Bearer <token>`",
        "fields": [
            {
                "field": "authorization",
                "message": "missing bearer token: send the header `Authorization: Bearer <token>`",
            }
        ],
    }
    assert missing.headers["www-authenticate"] == 'Bearer realm="ratewarden"'
    for header in (f"Bearer {BAD_TOKEN}", "Bearer", "Bearer ", f"Bearer {CHECK_TOKEN}x"):
        invalid = await guarded.get(
            "/v1/usage", params={"user": "u"}, headers={"authorization": header}
        )
        assert invalid.status_code == 401, header
        assert invalid.json()["message"] == "invalid bearer token"
        assert invalid.headers["www-authenticate"] == (
            'Bearer realm="ratewarden", error="invalid_token"'
        )
    # Another scheme is no bearer token at all.
    basic = await guarded.get(
        "/v1/usage", params={"user": "u"}, headers={"authorization": f"Basic {CHECK_TOKEN}"}
    )
    assert basic.status_code == 401
    assert basic.json()["message"].startswith("missing bearer token")
    # The scheme is case-insensitive (RFC 7235).
    lower = await guarded.get(
        "/v1/usage", params={"user": "u"}, headers={"authorization": f"bearer {CHECK_TOKEN}"}
    )
    assert lower.status_code == 200
    forbidden = await guarded.get("/v1/policy", headers=CALLERS["check"])
    assert forbidden.headers["www-authenticate"] == (
        'Bearer realm="ratewarden", error="insufficient_scope"'
    )


async def test_a_check_token_reaches_the_settle_route_with_any_call_id(
    guarded: httpx.AsyncClient,
) -> None:
    """A call_id with a newline is the route's 422 naming call_id, not an admin-only 403."""
    headers = {"authorization": f"Bearer {CHECK_TOKEN}"}
    for call_id in ("%0a", "a%0Ab", "x%0d%0a"):
        refused = await guarded.post(f"/v1/calls/{call_id}/settle", headers=headers)
        assert refused.status_code == 422, (call_id, refused.text)
        assert [f["field"] for f in refused.json()["fields"]] == ["call_id"]


async def test_auth_comes_before_the_body_is_read(guarded: httpx.AsyncClient) -> None:
    """Without a token, a broken body gets 401, not 422: nothing is parsed for strangers."""
    broken: dict[str, Any] = {
        "content": b"{not json",
        "headers": {"content-type": "application/json"},
    }
    assert (await guarded.post("/v1/check", **broken)).status_code == 401
    with_token = {"content-type": "application/json", **CALLERS["check"]}
    answer = await guarded.post("/v1/check", content=b"{not json", headers=with_token)
    assert answer.status_code == 422


async def test_unknown_paths_and_methods(guarded: httpx.AsyncClient) -> None:
    # A path with no route needs admin like any unlisted path: strangers get 401 and
    # learn nothing, an admin gets the 404. A known path with the wrong method keeps
    # its route's role.
    assert (await guarded.get("/v1/nothing-here")).status_code == 401
    assert (await guarded.get("/v1/nothing-here", headers=CALLERS["check"])).status_code == 403
    assert (await guarded.get("/v1/nothing-here", headers=CALLERS["admin"])).status_code == 404
    assert (await guarded.get("/v1/check")).status_code == 401
    # A trailing slash is redirected by the router; it keeps the role of its route.
    slash = await guarded.post("/v1/check/", headers=CALLERS["check"], json={})
    assert slash.status_code == 307
    assert (await guarded.get("/v1/check", headers=CALLERS["check"])).status_code == 405
    assert (await guarded.get("/v1/admin/reload", headers=CALLERS["check"])).status_code == 403


def test_every_route_has_a_decided_role(policy_file: Path) -> None:
    """A new endpoint must be put in auth.ROLES on purpose (unlisted ones need admin)."""
    app = create_app(settings_for(policy_file), store=MemoryStore(FakeClock()))
    listed = {re.sub(r"{(\w+):\w+}", r"{\1}", path) for path in auth.ROLES}
    documented = set(app.openapi()["paths"]) | {"/docs", "/docs/oauth2-redirect", "/redoc",
                                                "/docs/assets/{name}", "/openapi.json"}  # fmt: skip
    assert documented - listed == set(), "classify these routes in auth.ROLES"
    assert listed - documented == set(), "these auth.ROLES entries have no route"


def test_openapi_documents_the_bearer_scheme(policy_file: Path) -> None:
    app = create_app(settings_for(policy_file), store=MemoryStore(FakeClock()))
    schema = app.openapi()
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    paths = schema["paths"]
    check = paths["/v1/check"]["post"]
    assert check["security"] == [{"bearer": []}]
    assert {"401", "403"} <= set(check["responses"])
    assert "Needs a check or admin token." in check["description"]
    assert "Needs a viewer or admin token." in paths["/v1/policy"]["get"]["description"]
    settle = paths["/v1/calls/{call_id}/settle"]["post"]
    assert "Needs a check or admin token." in settle["description"]
    assert "Needs a check, viewer or admin token." in paths["/v1/usage"]["get"]["description"]
    assert "Needs an admin token." in paths["/v1/admin/reset"]["post"]["description"]
    overrides = paths["/v1/admin/overrides"]
    assert "Needs a viewer or admin token." in overrides["get"]["description"]
    assert "Needs an admin token." in overrides["post"]["description"]
    assert "security" not in paths["/healthz"]["get"]
    assert {
        path for path, ops in paths.items() if all("security" not in op for op in ops.values())
    } == {"/healthz", "/readyz", "/metrics", "/console", "/console/assets/{name}"}


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("api_tokens", "admin_tokens"),
        ("api_tokens", "viewer_tokens"),
        ("viewer_tokens", "admin_tokens"),
    ],
)
def test_a_token_in_two_roles_is_refused_naming_both(first: str, second: str) -> None:
    """One credential, one role: which one was meant cannot be guessed (the wrong guess
    grants too much), so the settings are refused, naming both lists and not the token."""
    values = {first: ["other-token", "same-token-0123"], second: ["same-token-0123"]}
    with pytest.raises(ValidationError, match="a token is in both") as refused:
        Settings(**values)  # type: ignore[arg-type]
    message = refused.value.errors()[0]["msg"]
    assert f"RATEWARDEN_{first.upper()}" in message
    assert f"RATEWARDEN_{second.upper()}" in message
    assert "same-token-0123" not in message


def test_serve_refuses_a_token_in_two_roles(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["serve", "--port", str(free_port()), "--viewer-token", "same-token-0123",
                 "--admin-token", "same-token-0123"])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "RATEWARDEN_VIEWER_TOKENS" in err
    assert "RATEWARDEN_ADMIN_TOKENS" in err
    assert "same-token-0123" not in err


async def test_admin_only_and_viewer_only_daemons(policy_file: Path) -> None:
    # Only admin tokens: check endpoints need one of them.
    admin_only = settings_for(policy_file, admin_tokens=[ADMIN_TOKEN])
    async with serving(create_app(admin_only, store=MemoryStore(FakeClock()))) as client:
        check: dict[str, Any] = {"json": {"user": "u", "tool": "terminal"}}
        assert (await client.post("/v1/check", **check)).status_code == 401
        admin = await client.post("/v1/check", headers=CALLERS["admin"], **check)
        assert admin.status_code == 200
    # Only viewer tokens: auth is on, and nobody may change anything.
    viewer_only = settings_for(policy_file, viewer_tokens=[VIEWER_TOKEN])
    assert auth.describe(viewer_only) == "auth on (0 check, 0 admin, 1 viewer tokens)"
    async with serving(create_app(viewer_only, store=MemoryStore(FakeClock()))) as client:
        assert (await client.get("/v1/denials")).status_code == 401
        assert (await client.get("/v1/denials", headers=CALLERS["viewer"])).status_code == 200
        reload = await client.post("/v1/admin/reload", headers=CALLERS["viewer"])
        assert reload.status_code == 403


def test_every_token_is_compared_and_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """No early exit: a match on the first token costs as many comparisons as a miss, and
    every comparison is hmac.compare_digest over equal-length digests."""
    compared: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        compared.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)  # the module auth compares with
    tokens = auth.Tokens(check=["c1", "c2-longer-token"], admin=["a1", "a2"], viewer=["v1"])
    cases = {
        b"a1": auth.ApiRole.ADMIN,
        b"a2": auth.ApiRole.ADMIN,
        b"c1": auth.ApiRole.CHECK,
        b"c2-longer-token": auth.ApiRole.CHECK,
        b"v1": auth.ApiRole.VIEWER,
        b"nope": auth.ApiRole.NONE,
        b"": auth.ApiRole.NONE,
        b"x" * 10_000: auth.ApiRole.NONE,
    }
    for presented, role in cases.items():
        compared.clear()
        assert tokens.role_of(presented) is role
        assert compared == [(32, 32)] * 5, presented


def test_tokens_from_the_environment_are_comma_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RATEWARDEN_API_TOKENS", " c-one, c-two ,,")
    monkeypatch.setenv("RATEWARDEN_ADMIN_TOKENS", "a-one")
    assert auth.describe(Settings()) == "auth on (2 check, 1 admin tokens)"
    monkeypatch.setenv("RATEWARDEN_VIEWER_TOKENS", "v-one,v-two")
    settings = Settings()
    assert settings.api_tokens == ["c-one", "c-two"]
    assert settings.admin_tokens == ["a-one"]
    assert settings.viewer_tokens == ["v-one", "v-two"]
    tokens = auth.Tokens.from_settings(settings)
    assert tokens.counts() == (2, 1)
    assert tokens.viewers == 2
    assert tokens.role_of(b"c-two") is auth.ApiRole.CHECK
    assert tokens.role_of(b"v-two") is auth.ApiRole.VIEWER
    assert auth.describe(settings) == "auth on (2 check, 1 admin, 2 viewer tokens)"


@pytest.mark.parametrize("token", ["has space", "tab\tinside", "caf\u00e9", "new\nline"])
def test_tokens_that_cannot_travel_in_a_header_are_refused(token: str) -> None:
    with pytest.raises(ValueError, match="printable ASCII without spaces"):
        Settings(admin_tokens=[token])
    with pytest.raises(ValueError, match="printable ASCII without spaces"):
        Settings(viewer_tokens=[token])


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.2.1", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.0.0.5", False),
        ("example.com", False),
        ("localhost.example.com", False),
    ],
)
def test_what_counts_as_loopback(host: str, loopback: bool) -> None:
    assert auth.is_loopback(host) is loopback


def test_no_tokens_means_loopback_only(capsys: pytest.CaptureFixture[str]) -> None:
    """`serve --host 0.0.0.0` without tokens is refused before anything starts."""
    assert main(["serve", "--host", "0.0.0.0", "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ratewarden: refusing to listen on 0.0.0.0 with auth off: ")
    assert "RATEWARDEN_API_TOKENS" in err
    assert "--insecure-no-auth" in err
    assert auth.bind_problem(Settings(host="0.0.0.0", insecure_no_auth=True)) is None
    assert auth.bind_problem(Settings(host="0.0.0.0", api_tokens=["t"])) is None
    assert auth.bind_problem(Settings(host="::1")) is None
    assert auth.describe(Settings()) == "auth off (no tokens: loopback clients only)"
    assert auth.describe(Settings(host="0.0.0.0", insecure_no_auth=True)) == (
        "auth OFF, not on loopback (--insecure-no-auth)"
    )


async def test_without_tokens_only_loopback_peers_are_served(policy_file: Path) -> None:
    """A second guard for an app served by something else than `ratewarden serve`."""
    store = MemoryStore(FakeClock())
    app = create_app(settings_for(policy_file), store=store)
    check: dict[str, Any] = {"json": {"user": "u", "tool": "terminal"}}
    async with app.router.lifespan_context(app):
        for peer, status in ((("127.0.0.1", 5), 200), (("::1", 5), 200), (("203.0.113.9", 5), 403)):
            transport = httpx.ASGITransport(app=app, client=peer)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                answer = await client.post("/v1/check", **check)
                assert answer.status_code == status, peer
                if status == 403:
                    assert_error_shape(answer.json())
                    assert "only loopback clients" in answer.json()["message"]
                    assert (await client.get("/metrics")).status_code == 200  # open stays open
    insecure = create_app(settings_for(policy_file, insecure_no_auth=True), store=store)
    async with insecure.router.lifespan_context(insecure):
        transport = httpx.ASGITransport(app=insecure, client=("203.0.113.9", 5))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            assert (await client.post("/v1/check", **check)).status_code == 200


# -- real processes ------------------------------------------------------------------------


def ready_line(daemon: Daemon) -> str:
    lines = [line for line in daemon.log_text().splitlines() if " ready on " in line]
    assert lines, daemon.log_text()
    return lines[0]


@contextlib.contextmanager
def running(cwd: Path, *flags: str, env: dict[str, str] | None = None) -> Iterator[Daemon]:
    """`ratewarden serve` on a free port in `cwd`, until it is ready and the block ends."""
    with running_daemon(cwd, *flags, env=env, ready="/readyz") as daemon:
        yield daemon


def ratewarden(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ratewarden", *args],
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.slow
def test_serve_with_tokens_from_flags(tmp_path: Path, policy_file: Path) -> None:
    flags = ["--policy", str(policy_file), "--api-token", CHECK_TOKEN,
             "--admin-token", ADMIN_TOKEN, "--admin-token", "second-admin",
             "--viewer-token", VIEWER_TOKEN]  # fmt: skip
    with running(tmp_path, *flags) as daemon:
        assert " | auth on (1 check, 2 admin, 1 viewer tokens) | " in ready_line(daemon)
        assert CHECK_TOKEN not in daemon.log_text()  # tokens are never logged
        assert VIEWER_TOKEN not in daemon.log_text()
        with httpx.Client(base_url=daemon.url, trust_env=False) as http:
            assert http.get("/v1/policy").status_code == 401
            assert http.get("/v1/policy", headers=CALLERS["check"]).status_code == 403
            assert http.get("/v1/policy", headers=CALLERS["viewer"]).status_code == 200
            reload = http.post("/v1/admin/reload", headers=CALLERS["viewer"])
            assert reload.status_code == 403
            for admin in (ADMIN_TOKEN, "second-admin"):
                answer = http.get("/v1/policy", headers={"authorization": f"Bearer {admin}"})
                assert answer.status_code == 200
        # The command line's clients send --token (or $RATEWARDEN_TOKEN).
        allowed = ratewarden("check", "--url", daemon.url, "--token", CHECK_TOKEN,
                             "--user", "u", "--tool", "terminal")  # fmt: skip
        assert (allowed.returncode, allowed.stderr) == (0, "")
        refused = ratewarden("check", "--url", daemon.url, "--user", "u", "--tool", "terminal")
        assert refused.returncode == 2
        assert refused.stderr == (  # a shell user sets a variable or a flag, not a header
            f"ratewarden: the daemon at {daemon.url} needs a token: set RATEWARDEN_TOKEN "
            "(or pass --token TOKEN)\n"
        )
        usage = ratewarden("usage", "--url", daemon.url, "--token", BAD_TOKEN, "--user", "u")
        assert usage.returncode == 2
        assert "invalid bearer token" in usage.stderr


def test_serve_without_tokens_says_auth_is_off(tmp_path: Path, policy_file: Path) -> None:
    with running(tmp_path, "--policy", str(policy_file)) as daemon:
        line = ready_line(daemon)
        assert " | auth off (no tokens: loopback clients only) | " in line
        with httpx.Client(base_url=daemon.url, trust_env=False) as http:
            assert http.get("/v1/policy").status_code == 200


@pytest.mark.slow
def test_serve_refuses_a_public_address_without_tokens_as_a_process(tmp_path: Path) -> None:
    done = ratewarden("serve", "--host", "0.0.0.0", "--port", str(free_port()))
    assert done.returncode == 2
    assert done.stderr.startswith("ratewarden: refusing to listen on 0.0.0.0 with auth off")
    # With a token from the environment it is allowed (and says auth is on).
    env = clean_environment(RATEWARDEN_API_TOKENS=f"{CHECK_TOKEN},other-check")
    with running(tmp_path, "--host", "0.0.0.0", env=env) as daemon:
        assert " | auth on (2 check, 0 admin tokens) | " in ready_line(daemon)
        with httpx.Client(base_url=daemon.url, trust_env=False) as http:
            check: dict[str, Any] = {"json": {"user": "u", "tool": "terminal"}}
            assert http.post("/v1/check", **check).status_code == 401
            ok = http.post("/v1/check", headers={"authorization": "Bearer other-check"}, **check)
            assert ok.status_code == 200


@pytest.mark.redis
@pytest.mark.slow
def test_workers_get_the_tokens_from_the_environment(
    tmp_path: Path, policy_file: Path, redis_server: RedisServer
) -> None:
    """`serve --workers 2` hands its settings to each worker through the environment:
    every worker enforces the same tokens."""
    redis_server.client().flushall()
    env = clean_environment(RATEWARDEN_ADMIN_TOKENS=ADMIN_TOKEN)
    flags = ["--workers", "2", "--store-url", redis_server.url, "--policy", str(policy_file),
             "--api-token", CHECK_TOKEN]  # fmt: skip
    with running(tmp_path, *flags, env=env) as daemon:
        for _ in range(20):  # new connections, spread over the workers by the kernel
            with httpx.Client(base_url=daemon.url, trust_env=False) as http:
                assert http.get("/v1/policy").status_code == 401
                assert http.get("/v1/policy", headers=CALLERS["check"]).status_code == 403
                reload = http.post("/v1/admin/reload", headers=CALLERS["admin"])
                assert reload.status_code == 200, reload.text
        assert daemon.log_text().count(" | auth on (1 check, 1 admin tokens) | ") == 2


def test_each_request_peer_is_parsed_once_and_no_request_is_kept() -> None:
    """`is_loopback` runs for every request: its cache is what keeps a decision's cost
    (a decorator slipped onto `admin_name` once cost every decision 4 % more
    instructions, bench/instructions.py, and kept the last 1 024 admin requests alive)."""
    from ratewarden.service.auth import admin_name, is_loopback

    assert hasattr(is_loopback, "cache_info")
    assert not hasattr(admin_name, "cache_info")
