"""Bearer-token auth: two roles, `check` and `admin`, checked before a request is read.

- `check` tokens (`API_TOKENS`) may decide, settle and read usage.
- `admin` tokens (`ADMIN_TOKENS`) may do everything, check endpoints included.
- Health, readiness, metrics and the API documentation are open (`OPEN`).
- A path missing from `ROLES` needs an admin token: a new endpoint is closed until
  someone decides otherwise (and a stranger gets 401, not 404, for a path that does
  not exist).

With no token configured, auth is off: `ratewarden serve` then refuses to listen on
anything but loopback (unless told `--insecure-no-auth`), and, as a second guard for
an app run by another server, requests from non-loopback peers are refused.

The check is an ASGI middleware, not a FastAPI dependency, so that an unauthenticated
request is answered 401 before its body is read or validated.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import hmac
import ipaddress
import json
import re
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI
from starlette.routing import compile_path
from starlette.types import ASGIApp, Receive, Scope, Send

from ratewarden.settings import Settings

REALM = "ratewarden"


class Role(enum.IntFlag):
    """What a token may do; ADMIN includes CHECK."""

    NONE = 0
    CHECK = 1
    ADMIN = 3


# Every endpoint's role, by route path. OPEN needs no token.
OPEN = Role.NONE
ROLES: dict[str, Role] = {
    "/v1/check": Role.CHECK,
    "/v1/check/batch": Role.CHECK,
    "/v1/calls/{call_id:path}/settle": Role.CHECK,
    "/v1/usage": Role.CHECK,
    "/v1/capabilities": Role.CHECK,
    "/v1/hooks/{host}": Role.CHECK,
    "/v1/hooks/{host}/decision": Role.CHECK,
    # Who was denied (user identities) and the whole policy (groups name users): admin.
    "/v1/denials": Role.ADMIN,
    "/v1/policy": Role.ADMIN,
    "/v1/admin/reset": Role.ADMIN,
    "/v1/admin/reload": Role.ADMIN,
    "/v1/admin/overrides": Role.ADMIN,
    "/v1/admin/overrides/{override_id}": Role.ADMIN,
    "/v1/admin/stats": Role.ADMIN,  # the console's overview
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
    # figure comes from the admin API above, called by the page with the admin token
    # (service/console.py), so the shell is open like the API documentation.
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


def role_needed(path: str) -> Role:
    """The role a request for `path` needs: its route's, else admin."""
    if len(path) > 1:
        path = path.rstrip("/")  # `/v1/check/` is redirected to `/v1/check`: same role
    for pattern, role in _PATTERNS:
        if pattern.match(path):
            return role
    return Role.ADMIN


class Tokens:
    """The configured tokens, kept as SHA-256 digests.

    `role_of` compares the presented token with every configured one, in constant time
    (equal-length digests through `hmac.compare_digest`) and without stopping at a
    match, so the time taken says neither whether nor which token matched.
    """

    def __init__(
        self, check: Iterable[str], admin: Iterable[str], admin_names: Iterable[str] = ()
    ) -> None:
        admin, names = list(admin), list(admin_names)
        names += [f"admin token {n}" for n in range(len(names) + 1, len(admin) + 1)]
        self._known = [(_digest(t.encode()), Role.ADMIN) for t in admin]
        self._known += [(_digest(t.encode()), Role.CHECK) for t in check]
        self._names = names  # of the admin tokens, in their order: who changed what

    @classmethod
    def from_settings(cls, settings: Settings) -> Tokens:
        return cls(settings.api_tokens, settings.admin_tokens, settings.admin_names)

    @property
    def enabled(self) -> bool:
        return bool(self._known)

    def counts(self) -> tuple[int, int]:
        """(check tokens, admin tokens)."""
        admin = sum(1 for _, role in self._known if role is Role.ADMIN)
        return len(self._known) - admin, admin

    def role_of(self, presented: bytes) -> Role:
        return self.identify(presented)[0]

    def identify(self, presented: bytes) -> tuple[Role, str | None]:
        """The token's role, and its configured name if it is an admin token."""
        digest = _digest(presented)
        granted, found = 0, -1
        for index, (known, role) in enumerate(self._known):
            matched = hmac.compare_digest(digest, known)
            granted |= int(role) * matched
            found = max(found, index * matched - (not matched))
        name = self._names[found] if 0 <= found < len(self._names) else None
        return Role(granted), name


def needs(role: Role) -> str:
    return {Role.NONE: "", Role.CHECK: "Needs a check token.", Role.ADMIN: "Needs an admin token."}[
        role
    ]


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


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
    if Tokens.from_settings(settings).enabled or settings.insecure_no_auth:
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
        return f"auth on ({check} check, {admin} admin tokens)"
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
        needed = role_needed(_route_path(scope))
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

    def refusal(self, scope: Scope, needed: Role) -> _Refusal | None:
        presented = _bearer(scope)
        if presented is None:
            return _Refusal(
                401,
                "unauthorized",
                "missing bearer token: send the header `Authorization: Bearer <token>`",
                f'Bearer realm="{REALM}"',
            )
        role, name = self.tokens.identify(presented)
        if role is Role.NONE:
            return _Refusal(
                401,
                "unauthorized",
                "invalid bearer token",
                f'Bearer realm="{REALM}", error="invalid_token"',
            )
        if (role & needed) != needed:
            return _Refusal(
                403,
                "forbidden",
                "this endpoint needs an admin token; a check token may only check, settle "
                "and read usage",
                f'Bearer realm="{REALM}", error="insufficient_scope"',
            )
        if name is not None:  # request.state.token_name: who made an admin change
            scope.setdefault("state", {})["token_name"] = name
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
            "description": "API_TOKENS (check role: check, settle, usage) or ADMIN_TOKENS "
            "(admin role: everything). Not needed when the daemon runs without tokens.",
        }
        error = {"$ref": "#/components/schemas/ErrorResponse"}
        for path, operations in schema.get("paths", {}).items():
            role = role_needed(path)
            if role is OPEN:
                continue
            for operation in operations.values():
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
