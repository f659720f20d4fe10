"""The gRPC listener: Envoy's RateLimitService and Authorization, served by the daemon.

Each RPC is authenticated like an HTTP request (a bearer token in the gRPC metadata,
Envoy's `initial_metadata`; with no token configured, loopback peers only), turned into
the call a `POST /v1/check` names (calls.py), decided through the same path as the HTTP
API (`routes.decide`: metrics, audit, who is blocked), and answered in the protocol's own
words (answers.py). A request that names no call is refused in its protocol (never a gRPC
error, which Envoy's failure mode may let through: calls.Refused), logged and counted;
nothing it carries is counted against a limit. Only Envoy's own credential refused, or a
bug, is a gRPC status.

Envoy asks before a request and is never told when it ends, so an allowed call that holds
something (budget money, a concurrency slot, a token rate's settle) is settled at once:
a tool call charged its estimate, a model call its tokens as its usage; a concurrency slot
is freed as it is taken (docs/envoy.md, "Budgets, concurrency and settling").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from envoy.service.auth.v3 import external_auth_pb2_grpc as authz_grpc
from envoy.service.auth.v3.external_auth_pb2 import CheckRequest as AuthzRequest
from envoy.service.auth.v3.external_auth_pb2 import CheckResponse as AuthzResponse
from envoy.service.ratelimit.v3 import rls_pb2_grpc as rls_grpc
from envoy.service.ratelimit.v3.rls_pb2 import RateLimitRequest, RateLimitResponse
from google.protobuf.json_format import MessageToDict

from ratewarden.engine import CallIdConflict, Decision
from ratewarden.service import routes
from ratewarden.service.auth import ANYONE, ApiRole, Caller, Tokens, is_loopback
from ratewarden.service.envoy import answers, calls
from ratewarden.service.envoy.calls import Refused
from ratewarden.service.settings import Settings
from ratewarden.store import StoreError
from ratewarden.vocabulary import CallKind, holds_until_settled, shown
from ratewarden.wire.bodies import CheckRequest, ModelUsage

log = logging.getLogger("ratewarden.envoy")
Answer = TypeVar("Answer")
LOG_EVERY_S = 10.0  # one refusal line per method and status this often, at most
MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # gRPC's own default, said aloud: a body Envoy sends


class Unauthorized(Exception):
    """Envoy's own credential refused: a gRPC status (Envoy's configuration is wrong, not
    the client's request), with `code` its name."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class Gate:
    """Whom an RPC's credential vouches for, as service/auth.py decides it for HTTP."""

    def __init__(self, tokens: Tokens, insecure: bool) -> None:
        self.tokens = tokens
        self.insecure = insecure

    def caller(self, context: grpc.aio.ServicerContext) -> Caller:
        if not self.tokens.enabled:
            if self.insecure or is_loopback(_peer_host(context.peer())):
                return ANYONE
            raise Unauthorized(
                "auth is off (no tokens configured), so only loopback peers are served",
                "PERMISSION_DENIED",
            )
        presented = dict(context.invocation_metadata() or ()).get("authorization", "")
        scheme, _, token = str(presented).partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("send a token: `authorization: Bearer <token>`", "UNAUTHENTICATED")
        role, _, caller = self.tokens.identify(token.encode())
        if role == ApiRole.NONE:
            raise Unauthorized("the token is not valid", "UNAUTHENTICATED")
        if not role & ApiRole.DECIDE:
            raise Unauthorized("this needs a check or admin token", "PERMISSION_DENIED")
        return caller


def _peer_host(peer: str) -> str:
    """`ipv4:127.0.0.1:5000` -> `127.0.0.1`, `ipv6:[::1]:5000` -> `::1`; else ``."""
    kind, _, address = peer.partition(":")
    if kind == "ipv4":
        return address.rpartition(":")[0]
    if kind == "ipv6":
        return address.rpartition(":")[0].strip("[]")
    return ""


def vouched(caller: Caller, body: CheckRequest, where: str) -> CheckRequest:
    """`body` as its credential may name it (service/vouch.py's rule, in gRPC's words):
    a user token's own user when it names none, `where` the user would come from."""
    if body.user is None:
        if caller.user is None:
            raise Refused(f"{where}: required: who calls (set by Envoy after jwt_authn)")
        return body.model_copy(update={"user": caller.user})
    if caller is not ANYONE and not caller.may_act_for(body.user):
        raise Refused(
            f"{where}: {caller.who()}; a request cannot name another user",
            "PERMISSION_DENIED",
            403,
        )
    return body


class RefusalLog:
    """The log lines of refused requests: at most one per method and status every
    LOG_EVERY_S, saying how many were left out (every one is counted in
    ratewarden_grpc_answers_total), so a client able to send invalid requests at will
    cannot flood the log; its own text escaped (a newline cannot forge a line)."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str], tuple[float, int]] = {}  # -> (when, left out)

    def refused(self, method: str, exc: Refused | Unauthorized) -> None:
        key, now = (method, exc.code), time.monotonic()
        when, left_out = self._last.get(key, (-LOG_EVERY_S, 0))
        if now - when < LOG_EVERY_S:
            self._last[key] = (when, left_out + 1)
            return
        self._last[key] = (now, 0)
        more = f" ({left_out} more since the last such line)" if left_out else ""
        log.warning("envoy %s refused (%s): %s%s", method, exc.code, shown(str(exc)), more)


class Decider:
    """The path both services share: authenticate, decide, settle a holding call at once."""

    def __init__(self, app: Any, gate: Gate) -> None:
        self.app = app
        self.gate = gate
        self.metrics = routes.observer_of(app).metrics
        self.logged = RefusalLog()

    def answered(self, method: str, code: str = "OK") -> None:
        """Counted in ratewarden_grpc_answers_total."""
        self.metrics.series(self.metrics.grpc_answers, method, code).inc()

    async def serve(
        self,
        method: str,
        context: grpc.aio.ServicerContext,
        answer: Callable[[], Awaitable[Answer]],
        refuse: Callable[[Refused], Answer],
    ) -> Answer:
        """`answer()`, counted; a request naming no call refused in the protocol by
        `refuse` (calls.Refused says why not as an error), logged and counted by the
        status it stands for; Envoy's credential refused, or a bug, a gRPC status."""
        try:
            found = await answer()
        except Refused as exc:
            self.logged.refused(method, exc)
            self.answered(method, exc.code)
            return refuse(exc)
        except Exception as exc:  # answered, and logged with its traceback
            await _failed(self, context, method, exc)
            raise  # not reached: abort raises
        self.answered(method)
        return found

    async def decide(self, body: CheckRequest) -> Decision:
        try:
            decision = await routes.decide(self.app, body)
        except CallIdConflict as exc:
            raise Refused(str(exc), "ALREADY_EXISTS", 409) from None
        if (
            decision.allowed
            and not decision.replayed
            and holds_until_settled(decision.send_result, decision.limits)
        ):
            await self._settle(decision, body)
        return decision

    async def _settle(self, decision: Decision, body: CheckRequest) -> None:
        """Settle at once: a tool call charged its estimate; a model call its tokens, as
        its usage (so its token rates count them too)."""
        engine = routes.engine_of(self.app)
        usage = None
        if body.kind == CallKind.MODEL:
            usage = ModelUsage(input_tokens=body.input_tokens or 0)
        try:
            settled = await engine.settle(decision.call_id, usage=usage)
        except StoreError as exc:  # its reservation expires and is charged by the sweep
            log.warning("envoy: call %s not settled (%s)", decision.call_id, exc)
            return
        routes.observer_of(self.app).settled(settled, engine.policy)


async def _failed(
    decider: Decider, context: grpc.aio.ServicerContext, method: str, exc: Exception
) -> None:
    """Envoy's credential refused, or an unexpected error (logged with its traceback, never
    the listener's end): a gRPC status, which Envoy answers by its failure mode."""
    if isinstance(exc, Unauthorized):
        code, message = exc.code, str(exc)
        decider.logged.refused(method, exc)
    else:
        code, message = "INTERNAL", "ratewarden could not decide: see its log"
        log.exception("envoy %s failed", method)
    decider.answered(method, code)
    await context.abort(grpc.StatusCode[code], message)


class RateLimitService(rls_grpc.RateLimitServiceServicer):  # type: ignore[misc]
    def __init__(self, decider: Decider) -> None:
        self.decider = decider

    async def ShouldRateLimit(  # noqa: N802 (the protocol's name)
        self, request: RateLimitRequest, context: grpc.aio.ServicerContext
    ) -> RateLimitResponse:
        descriptors = len(request.descriptors)

        async def answer() -> RateLimitResponse:
            caller = self.decider.gate.caller(context)
            asked = calls.from_descriptors(request.domain, _entries(request), _hits(request))
            body = vouched(caller, asked, "descriptor entry 'user'")
            decision = await self.decider.decide(body)
            return answers.ratelimit_response(decision, descriptors)

        def refuse(exc: Refused) -> RateLimitResponse:
            return answers.ratelimit_refusal(str(exc), descriptors)

        return await self.decider.serve("ShouldRateLimit", context, answer, refuse)


def _entries(request: RateLimitRequest) -> list[list[tuple[str, str]]]:
    return [[(e.key, e.value) for e in d.entries] for d in request.descriptors]


def _hits(request: RateLimitRequest) -> int:
    """The request's hits_addend, or the largest a descriptor gives; 0: none given."""
    given = [d.hits_addend.value for d in request.descriptors if d.HasField("hits_addend")]
    return int(max([request.hits_addend, *given]))


class AuthorizationService(authz_grpc.AuthorizationServicer):  # type: ignore[misc]
    def __init__(self, decider: Decider, user_header: str) -> None:
        self.decider = decider
        self.user_header = user_header

    async def Check(  # noqa: N802 (the protocol's name)
        self, request: AuthzRequest, context: grpc.aio.ServicerContext
    ) -> AuthzResponse:
        async def answer() -> AuthzResponse:
            caller = self.decider.gate.caller(context)
            asked = self._call(request.attributes)
            if asked is None:
                return answers.ALLOWED  # an MCP route's request that calls no tool
            body, mcp = asked
            vouched_for = vouched(caller, body, f"header {self.user_header!r}")
            return answers.authorization_response(await self.decider.decide(vouched_for), mcp)

        def refuse(exc: Refused) -> AuthzResponse:
            return answers.authorization_refusal(str(exc), exc.status)

        return await self.decider.serve("Check", context, answer, refuse)

    def _call(self, attributes: Any) -> tuple[CheckRequest, calls.McpCall | None] | None:
        http = attributes.request.http
        headers = dict(http.headers) or {
            h.key: h.raw_value.decode(errors="replace") for h in http.header_map.headers
        }
        namespace = attributes.metadata_context.filter_metadata.get(calls.MCP)
        mcp = MessageToDict(namespace) if namespace is not None else None
        body = http.raw_body or http.body.encode()
        return calls.from_authorization(
            headers, dict(attributes.context_extensions), mcp, body, self.user_header
        )


def build(app: Any, settings: Settings) -> grpc.aio.Server:
    """The listener, both services on it, bound to `settings.host`:`grpc_port` (several
    workers share the port: gRPC sets SO_REUSEPORT)."""
    tokens: Tokens = app.state.tokens
    decider = Decider(app, Gate(tokens, settings.insecure_no_auth))
    server = grpc.aio.server(
        options=[
            ("grpc.so_reuseport", int(settings.workers > 1)),  # else a busy port is an error
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ]
    )
    rls_grpc.add_RateLimitServiceServicer_to_server(RateLimitService(decider), server)
    authz_grpc.add_AuthorizationServicer_to_server(
        AuthorizationService(decider, settings.envoy_user_header), server
    )
    address = f"[{settings.host}]" if ":" in settings.host else settings.host
    server.add_insecure_port(f"{address}:{settings.grpc_port}")
    return server
