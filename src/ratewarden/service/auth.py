"""Bearer-token auth: three roles, `check`, `viewer` and `admin`, checked before a request
is read, and who a token vouches for (its `Caller`).

- `check` tokens may decide, settle and read usage. There are two kinds. A service token
  (`API_TOKENS`) belongs to a gateway that authenticated its users itself and vouches for
  the user a request names: any user, or only those matching its globs
  (`API_TOKEN_USERS`). A user token (`USER_TOKENS`, a file in the MCP gateway's tokens
  format, ratewarden/tokens.py) is bound to one user: a request with it acts as that user
  and no other (service/vouch.py holds that rule for every route).
- `viewer` tokens (`VIEWER_TOKENS`) read what an operator reads, for anyone: the console,
  its stats, usage, refusals, the policy and the runtime overrides; they neither decide
  nor change anything (no check, settle, reset, override or reload).
- `admin` tokens (`ADMIN_TOKENS`) may do everything, check endpoints included, for anyone.
- Health, readiness, metrics and the API documentation are open (`OPEN`).
- A path missing from `ROLES` needs an admin token: a new endpoint is closed until
  someone decides otherwise (and a stranger gets 401, not 404, for a path that does
  not exist). So does a method a path does not list, where its entry is by method.

A token in two of the lists is refused at start (settings.py): one credential, one role.

With no token configured, auth is off: `ratewarden serve` then refuses to listen on
anything but loopback (unless told `--insecure-no-auth`), and, as a second guard for
an app run by another server, requests from non-loopback peers are refused.

The check is an ASGI middleware, not a FastAPI dependency, so that an unauthenticated
request is answered 401 before its body is read or validated.
"""

from __future__ import annotations

import enum
import fnmatch
import functools
import hmac
import ipaddress
import json
import logging
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter, FastAPI, Request
from pydantic import BaseModel, Field
from starlette.routing import compile_path
from starlette.types import ASGIApp, Receive, Scope, Send

from ratewarden.service.settings import Settings
from ratewarden.wire.bodies import SETTLE_PATH
from ratewarden.wire.tokens import digest, read_tokens

REALM = "ratewarden"
log = logging.getLogger("ratewarden.auth")


class ApiRole(enum.IntFlag):
    """What a token may do, and what a route asks for. A token has one of three roles,
    CHECK, VIEWER or ADMIN, each a set of the permissions below; a request passes when its
    token holds every permission its route asks for (`ROLES`)."""

    NONE = 0
    TOKEN = 1  # any valid token: who it is (GET /v1/whoami)
    DECIDE = 2  # check and settle
    USAGE = 4  # read a user's counters (a check token: the users it vouches for)
    READ = 8  # read the fleet's figures: stats, refusals, the policy, runtime overrides
    CHANGE = 16  # reset, reload, grant and remove runtime overrides
    CHECK = TOKEN | DECIDE | USAGE
    VIEWER = TOKEN | USAGE | READ
    ADMIN = TOKEN | DECIDE | USAGE | READ | CHANGE


TOKEN_ROLES = (ApiRole.CHECK, ApiRole.VIEWER, ApiRole.ADMIN)
# The setting that lists each role's tokens (user tokens, a file, are check tokens too).
SETTINGS = {
    ApiRole.CHECK: "RATEWARDEN_API_TOKENS",
    ApiRole.VIEWER: "RATEWARDEN_VIEWER_TOKENS",
    ApiRole.ADMIN: "RATEWARDEN_ADMIN_TOKENS",
}

# What each endpoint asks for, by route path; by method where its methods differ (a
# method not listed then asks for ADMIN). OPEN needs no token.
OPEN = ApiRole.NONE
ROLES: dict[str, ApiRole | dict[str, ApiRole]] = {
    "/v1/check": ApiRole.DECIDE,
    "/v1/check/batch": ApiRole.DECIDE,
    SETTLE_PATH.format(call_id="{call_id:path}"): ApiRole.DECIDE,
    "/v1/usage": ApiRole.USAGE,
    "/v1/capabilities": ApiRole.DECIDE,
    "/v1/hooks/{host}": ApiRole.DECIDE,
    "/v1/hooks/{host}/decision": ApiRole.DECIDE,
    "/v1/whoami": ApiRole.TOKEN,
    # Who was denied (user identities) and the whole policy (groups name users): an
    # operator's reads, for viewer and admin tokens.
    "/v1/denials": ApiRole.READ,
    "/v1/policy": ApiRole.READ,
    "/v1/admin/stats": ApiRole.READ,  # the console's overview
    "/v1/admin/blocked": ApiRole.READ,  # who is blocked, fleet-wide
    "/v1/admin/activity": ApiRole.READ,  # decisions and refusals over time
    "/v1/admin/spend": ApiRole.READ,  # what each user and team spent, per day
    "/v1/admin/overrides": {"GET": ApiRole.READ, "POST": ApiRole.CHANGE},
    "/v1/admin/overrides/{override_id}": {"DELETE": ApiRole.CHANGE},
    "/v1/admin/reset": ApiRole.CHANGE,
    "/v1/admin/reload": ApiRole.CHANGE,
    # Liveness and readiness for orchestrators, metrics for Prometheus (no user identity
    # is ever a label), and the API documentation.
    "/healthz": OPEN,
    "/readyz": OPEN,
    "/metrics": OPEN,
    "/docs": OPEN,
    "/docs/oauth2-redirect": OPEN,
    "/docs/assets/{name}": OPEN,  # packaged files, as the console's (service/apidocs.py)
    "/redoc": OPEN,
    "/openapi.json": OPEN,
    # The console's page and its packaged assets hold no data and no secret: every
    # figure comes from the API above, called by the page with the viewer's or admin's
    # token (service/console.py), so the shell is open like the API documentation.
    "/console": OPEN,
    "/console/assets/{name}": OPEN,
}
# The same paths as regular expressions, matched like the router matches them; a path
# parameter may hold any character, a newline too (the route then answers with a 422
# naming it, which a check token must reach rather than a 403).
_PATTERNS = [
    (re.compile(regex.pattern, re.DOTALL), role)
    for (regex, _, _), role in ((compile_path(path), role) for path, role in ROLES.items())
]


def role_needed(path: str, method: str = "GET") -> ApiRole:
    """What a `method` request for `path` asks for: its route's, else ADMIN."""
    if len(path) > 1:
        path = path.rstrip("/")  # `/v1/check/` is redirected to `/v1/check`: same role
    for pattern, role in _PATTERNS:
        if pattern.match(path):
            if isinstance(role, dict):  # HEAD is answered as GET
                return role.get("GET" if method == "HEAD" else method, ApiRole.ADMIN)
            return role
    return ApiRole.ADMIN


def allows(role: ApiRole, needed: ApiRole) -> bool:
    """Whether a token of `role` may make a request that asks for `needed`."""
    return (role & needed) == needed


def roles_for(needed: ApiRole) -> str:
    """The token roles a request asking for `needed` takes: `a viewer or admin token`."""
    names = [role.name.lower() for role in TOKEN_ROLES if role.name and allows(role, needed)]
    words = ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]
    return ("an " if words[0] in "aeiou" else "a ") + words + " token"


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request's token vouches for: one user (a user token), the users matching some
    globs (a limited service token), or anyone (ANYONE: an unrestricted service token, an
    admin token, or auth off on loopback)."""

    user: str | None = None  # a user token's user: the one user the request acts as
    globs: tuple[str, ...] | None = None  # a limited service token's users; None: any

    def may_act_for(self, user: str) -> bool:
        """Whether this caller may name `user` (check, usage) or settle `user`'s calls.
        Names are compared exactly, as every rule compares them."""
        if self.user is not None:
            return user == self.user
        if self.globs is None:
            return True
        return any(fnmatch.fnmatchcase(user, glob) for glob in self.globs)

    def who(self) -> str:
        """What a refusal says the token may name."""
        if self.user is not None:
            return f"this user token acts as {self.user!r} only"
        return f"this service token vouches only for users matching {' '.join(self.globs or ())}"


ANYONE = Caller()


class Tokens:
    """The configured tokens, kept as SHA-256 digests.

    `identify` compares the presented token with every admin, viewer and service token, in
    constant time (equal-length digests through `hmac.compare_digest`) and without
    stopping at a match, so the time taken says neither whether nor which token matched.
    User tokens, which may be thousands, are looked up by digest (a dict of SHA-256
    digests: the time says nothing of the token). The user tokens file is read again by
    `reload_users` (on each policy reload); the admin, viewer and service tokens are
    settings.
    """

    def __init__(
        self,
        check: Iterable[str],
        admin: Iterable[str],
        admin_names: Iterable[str] = (),
        *,
        viewer: Iterable[str] = (),
        service_globs: Sequence[tuple[str, ...] | None] = (),
        users_file: Path | None = None,
    ) -> None:
        admin, check, names = list(admin), list(check), list(admin_names)
        viewers = list(viewer)
        names += [f"admin token {n}" for n in range(len(names) + 1, len(admin) + 1)]
        globs = [*service_globs, *[None] * (len(check) - len(service_globs))]
        self._known = [(digest(t), ApiRole.ADMIN) for t in admin]
        self._known += [(digest(t), ApiRole.CHECK) for t in check]
        self._known += [(digest(t), ApiRole.VIEWER) for t in viewers]
        self._callers = [ANYONE] * len(admin) + [
            ANYONE if g is None else Caller(globs=g) for g in globs
        ]
        self._callers += [ANYONE] * len(viewers)  # a viewer reads anyone's figures
        self._names = names  # of the admin tokens, in their order: who changed what
        self._users_file = users_file
        self._users: dict[bytes, str] = {}
        if users_file is not None:
            self._users = self._read_users(users_file)
        # Whether any token is asked for: fixed at start (a reload reads the users file
        # again, never drops it), and read by every request, so an attribute.
        self.enabled = bool(self._known or users_file is not None)

    @classmethod
    def from_settings(cls, settings: Settings) -> Tokens:
        """The settings' tokens; a bad user tokens file raises ValueError naming it."""
        return cls(
            settings.api_tokens,
            settings.admin_tokens,
            settings.admin_names,
            viewer=settings.viewer_tokens,
            service_globs=settings.service_globs(),
            users_file=settings.user_tokens,
        )

    def counts(self) -> tuple[int, int]:
        """(check tokens, admin tokens)."""
        check = sum(1 for _, role in self._known if role is ApiRole.CHECK)
        admin = sum(1 for _, role in self._known if role is ApiRole.ADMIN)
        return check, admin

    @property
    def viewers(self) -> int:
        """How many viewer tokens."""
        return sum(1 for _, role in self._known if role is ApiRole.VIEWER)

    @property
    def users(self) -> int:
        """How many users have a token of their own."""
        return len(set(self._users.values()))

    def role_of(self, presented: bytes) -> ApiRole:
        return self.identify(presented)[0]

    def identify(self, presented: bytes) -> tuple[ApiRole, str | None, Caller]:
        """The token's role, its configured name if it is an admin token, and whom it
        vouches for."""
        found_digest = digest(presented)
        granted, found = 0, -1
        for index, (known, role) in enumerate(self._known):
            matched = hmac.compare_digest(found_digest, known)
            granted |= int(role) * matched
            found = max(found, index * matched - (not matched))
        user = self._users.get(found_digest)
        if found >= 0:
            name = self._names[found] if found < len(self._names) else None
            caller = ANYONE if granted == ApiRole.ADMIN else self._callers[found]
            return ApiRole(granted), name, caller
        if user is not None:
            return ApiRole.CHECK, None, Caller(user=user)
        return ApiRole.NONE, None, ANYONE

    def reload_users(self) -> str | None:
        """Read the user tokens file again; on a mistake keep the tokens in force and
        return the mistake (naming the file and the user, never a token)."""
        if self._users_file is None:
            return None
        try:
            self._users = self._read_users(self._users_file)
        except ValueError as exc:
            log.error("user tokens not reloaded; the tokens in force stay: %s", exc)
            return str(exc)
        log.info("user tokens reloaded from %s: %d users", self._users_file, self.users)
        return None

    def _read_users(self, path: Path) -> dict[bytes, str]:
        """The file's tokens by digest. A token that is also an admin, viewer or service
        token is refused: one credential, one identity."""
        users = {digest(token): user for token, user in read_tokens(path).items()}
        for known, role in self._known:
            if known in users:
                raise ValueError(
                    f"tokens file {path}: user {users[known]!r}: a token that is also one of "
                    f"{SETTINGS[role]} (a token is bound to one user, or is a service, viewer "
                    "or admin token)"
                )
        return users


def needs(role: ApiRole) -> str:
    """What the API documentation says an operation takes: `Needs an admin token.`"""
    return "" if role is OPEN else f"Needs {roles_for(role)}."


# What a token that lacks a route's permissions may do, for its 403.
MAY_ONLY = {
    ApiRole.CHECK: "a check token (service or user) may only check, settle and read usage",
    ApiRole.VIEWER: "a viewer token may only read (stats, usage, refusals, the policy and "
    "runtime overrides): it cannot check, settle, reset, override or reload",
}


def admin_name(request: Any) -> str:
    """Who made an admin change: the admin token's configured name (set on the request's
    state by the middleware below), or what stands in for one."""
    return str(getattr(request.state, "token_name", None) or "anonymous (auth off)")


@functools.lru_cache(maxsize=1024)  # asked for every request's peer: parse each address once
def is_loopback(host: str) -> bool:
    """`localhost`, 127.0.0.0/8, ::1 (and ::ffff:127.x). Anything else, `0.0.0.0` and `::`
    included, is not."""
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False  # a host name: it may resolve anywhere
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def bind_problem(settings: Settings) -> str | None:
    """Why `serve` must not start with these settings, or None."""
    try:
        tokens = Tokens.from_settings(settings)
    except ValueError as exc:  # the user tokens file: named, with what is wrong
        return f"RATEWARDEN_USER_TOKENS: {exc}"
    if tokens.enabled or settings.insecure_no_auth:
        return None
    if is_loopback(settings.host):
        return None
    return (
        f"refusing to listen on {settings.host} with auth off: no API or admin token is "
        "configured. Set RATEWARDEN_API_TOKENS / RATEWARDEN_ADMIN_TOKENS (comma-separated), "
        "or listen on loopback (--host 127.0.0.1), or pass --insecure-no-auth if something "
        "else guards the network"
    )


def describe(settings: Settings) -> str:
    """The auth part of the start-up line."""
    tokens = Tokens.from_settings(settings)
    if tokens.enabled:
        check, admin = tokens.counts()
        users = f", {tokens.users} users' tokens" if settings.user_tokens is not None else ""
        viewers = f", {tokens.viewers} viewer" if tokens.viewers else ""
        return f"auth on ({check} check, {admin} admin{viewers} tokens{users})"
    if settings.insecure_no_auth and not is_loopback(settings.host):
        return "auth OFF, not on loopback (--insecure-no-auth)"
    return "auth off (no tokens: loopback clients only)"


class AuthMiddleware:
    """Answer 401/403 before the app sees a request that lacks the role its route needs."""

    def __init__(self, app: ASGIApp, *, tokens: Tokens, insecure: bool) -> None:
        self.app = app
        self.tokens = tokens
        self.insecure = insecure

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        needed = role_needed(_route_path(scope), scope["method"])
        if needed is OPEN:
            await self.app(scope, receive, send)
            return
        if not self.tokens.enabled:
            refusal = None if self.insecure else _non_loopback_refusal(scope)
        else:
            refusal = self.refusal(scope, needed)
        if refusal is None:
            await self.app(scope, receive, send)
        else:
            await refusal.send(send)

    def refusal(self, scope: Scope, needed: ApiRole) -> _Refusal | None:
        presented = _bearer(scope)
        if presented is None:
            return _Refusal(
                401,
                "unauthorized",
                "missing bearer token: send the header `Authorization: Bearer <token>`",
                f'Bearer realm="{REALM}"',
            )
        role, name, caller = self.tokens.identify(presented)
        if role is ApiRole.NONE:
            return _Refusal(
                401,
                "unauthorized",
                "invalid bearer token",
                f'Bearer realm="{REALM}", error="invalid_token"',
            )
        if (role & needed) != needed:  # allows(), inline: every request passes here
            return _Refusal(
                403,
                "forbidden",
                f"this endpoint needs {roles_for(needed)}; "
                + MAY_ONLY.get(role, "this token may not"),
                f'Bearer realm="{REALM}", error="insufficient_scope"',
            )
        state = scope.setdefault("state", {})
        if name is not None:  # request.state.token_name: who made an admin change
            state["token_name"] = name
        if caller is not ANYONE:  # request.state.caller: whom the token vouches for
            state["caller"] = caller
        return None


def _route_path(scope: Scope) -> str:
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


def _bearer(scope: Scope) -> bytes | None:
    """The token of the first `Authorization: Bearer …` header, else None."""
    headers: list[tuple[bytes, bytes]] = scope["headers"]
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() != b"bearer":
                return None
            return token.strip()
    return None


def _non_loopback_refusal(scope: Scope) -> _Refusal | None:
    client = scope.get("client")
    if client is None or is_loopback(str(client[0])):
        return None  # a unix socket, or a local peer
    return _Refusal(
        403,
        "forbidden",
        "auth is off (no tokens configured), so only loopback clients are served; "
        "configure RATEWARDEN_API_TOKENS / RATEWARDEN_ADMIN_TOKENS",
        None,
    )


class WhoAmI(BaseModel):
    role: Literal["check", "viewer", "admin"] = Field(
        description="what the token may do; `admin` for anyone when auth is off (loopback)"
    )
    name: str | None = Field(
        None, description="an admin token's name (RATEWARDEN_ADMIN_NAMES), else null"
    )


router = APIRouter()


@router.get("/v1/whoami", response_model=WhoAmI, tags=["inspect"])
async def whoami(request: Request) -> WhoAmI:
    """The role of the token that asks: the console hides what a viewer may not do."""
    tokens: Tokens = request.app.state.tokens
    presented = _bearer(request.scope)
    if not tokens.enabled or presented is None:  # auth off: this loopback peer may do all
        return WhoAmI(role="admin")
    role, name, _ = tokens.identify(presented)  # a valid token: the middleware let it in
    shown = "admin" if role is ApiRole.ADMIN else "viewer" if role is ApiRole.VIEWER else "check"
    return WhoAmI(role=shown, name=name)


def document(app: FastAPI) -> None:
    """Show the bearer scheme in the OpenAPI schema: each operation's role, 401 and 403."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = build()
        components = schema.setdefault("components", {})
        components.setdefault("securitySchemes", {})["bearer"] = {
            "type": "http",
            "scheme": "bearer",
            "description": "API_TOKENS (service tokens, check role: check, settle, usage, "
            "for the users they vouch for), USER_TOKENS (check role, as their own user only), "
            "VIEWER_TOKENS (viewer role: read stats, usage, refusals, the policy and runtime "
            "overrides; no check, settle or change) or ADMIN_TOKENS (admin role: everything). "
            "Not needed when the daemon runs without tokens.",
        }
        error = {"$ref": "#/components/schemas/ErrorResponse"}
        for path, operations in schema.get("paths", {}).items():
            for method, operation in operations.items():
                role = role_needed(path, method.upper())
                if role is OPEN:
                    continue
                operation["security"] = [{"bearer": []}]
                operation["description"] = (
                    operation.get("description", "") + "\n\n" + needs(role)
                ).strip()
                responses = operation.setdefault("responses", {})
                for status, text in (("401", "missing or invalid token"), ("403", "forbidden")):
                    responses[status] = {
                        "description": text,
                        "content": {"application/json": {"schema": error}},
                    }
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


class _Refusal:
    def __init__(self, status: int, error: str, message: str, challenge: str | None) -> None:
        self.status = status
        self.body: dict[str, Any] = {
            "error": error,
            "message": message,
            "fields": [{"field": "authorization", "message": message}],
        }
        self.challenge = challenge

    async def send(self, send: Send) -> None:
        payload = json.dumps(self.body).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
        ]
        if self.challenge:
            headers.append((b"www-authenticate", self.challenge.encode()))
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})
