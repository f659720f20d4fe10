"""The gRPC listener: Envoy's RateLimitService and Authorization, served by the daemon
on its own event loop (http/grpc.py carries the calls; the messages are xds-protos').

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
from typing import Any

from envoy.service.auth.v3 import external_auth_pb2
from envoy.service.auth.v3.external_auth_pb2 import CheckRequest as AuthzRequest
from envoy.service.ratelimit.v3 import rls_pb2
from envoy.service.ratelimit.v3.rls_pb2 import RateLimitRequest
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import DecodeError, Message

from ratewarden.engine import CallIdConflict, Decision
from ratewarden.http.connections import ConnectionGate, connection_limits
from ratewarden.http.grpc import Call, GrpcError, Status, UnaryServer
from ratewarden.service import routes
from ratewarden.service.auth import ANYONE, ApiRole, Caller, Tokens, is_loopback
from ratewarden.service.envoy import answers, calls
from ratewarden.service.envoy.calls import Refused
from ratewarden.service.settings import Settings
from ratewarden.store import StoreError
from ratewarden.vocabulary import CallKind, holds_until_settled, shown
from ratewarden.wire.bodies import CheckRequest, ModelUsage

log = logging.getLogger("ratewarden.envoy")
LOG_EVERY_S = 10.0  # one refusal line per method and status this often, at most


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

    def caller(self, call: Call) -> Caller:
        if not self.tokens.enabled:
            if self.insecure or is_loopback(call.peer):
                return ANYONE
            raise Unauthorized(
                "auth is off (no tokens configured), so only loopback peers are served",
                "PERMISSION_DENIED",
            )
        scheme, _, token = call.metadata.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthorized("send a token: `authorization: Bearer <token>`", "UNAUTHENTICATED")
        role, _, caller = self.tokens.identify(token.encode())
        if role == ApiRole.NONE:
            raise Unauthorized("the token is not valid", "UNAUTHENTICATED")
        if not role & ApiRole.DECIDE:
            raise Unauthorized("this needs a check or admin token", "PERMISSION_DENIED")
        return caller


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
        answer: Callable[[], Awaitable[Message]],
        refuse: Callable[[Refused], Message],
    ) -> bytes:
        """`answer()`, counted; a request naming no call refused in the protocol by
        `refuse` (calls.Refused says why not as an error), logged and counted by the
        status it stands for; Envoy's credential refused, or a bug, a gRPC status."""
        try:
            found = await answer()
        except Refused as exc:
            self.logged.refused(method, exc)
            self.answered(method, exc.code)
            return bytes(refuse(exc).SerializeToString())
        except Exception as exc:  # answered, and logged with its traceback
            raise self._failed(method, exc) from None
        self.answered(method)
        return bytes(found.SerializeToString())

    def _failed(self, method: str, exc: Exception) -> GrpcError:
        """Envoy's credential refused, or an unexpected error (logged with its traceback,
        never the listener's end): a gRPC status, which Envoy answers by its failure mode."""
        if isinstance(exc, Unauthorized):
            status, message = Status[exc.code], str(exc)
            self.logged.refused(method, exc)
        else:
            status, message = Status.INTERNAL, "ratewarden could not decide: see its log"
            log.exception("envoy %s failed", method)
        self.answered(method, status.name)
        return GrpcError(status, message)

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


def _parsed(kind: type[Any], call: Call) -> Any:
    """The call's message as `kind`; one that is not is refused in the protocol."""
    try:
        return kind.FromString(call.message)
    except DecodeError:
        raise Refused(f"the request is not a {kind.__name__}") from None


class RateLimitService:
    """`ShouldRateLimit`: the request's descriptors as one call (calls.from_descriptors)."""

    def __init__(self, decider: Decider) -> None:
        self.decider = decider

    async def should_rate_limit(self, call: Call) -> bytes:
        descriptors = 0

        async def answer() -> Message:
            nonlocal descriptors
            request = _parsed(RateLimitRequest, call)
            descriptors = len(request.descriptors)
            caller = self.decider.gate.caller(call)
            asked = calls.from_descriptors(request.domain, _entries(request), _hits(request))
            body = vouched(caller, asked, "descriptor entry 'user'")
            decision = await self.decider.decide(body)
            return answers.ratelimit_response(decision, descriptors)

        def refuse(exc: Refused) -> Message:
            return answers.ratelimit_refusal(str(exc), descriptors)

        return await self.decider.serve("ShouldRateLimit", answer, refuse)


def _entries(request: RateLimitRequest) -> list[list[tuple[str, str]]]:
    return [[(e.key, e.value) for e in d.entries] for d in request.descriptors]


def _hits(request: RateLimitRequest) -> int:
    """The request's hits_addend, or the largest a descriptor gives; 0: none given."""
    given = [d.hits_addend.value for d in request.descriptors if d.HasField("hits_addend")]
    return int(max([request.hits_addend, *given]))


class AuthorizationService:
    """`Check`: the request Envoy would pass upstream, as a call (calls.from_authorization)."""

    def __init__(self, decider: Decider, user_header: str) -> None:
        self.decider = decider
        self.user_header = user_header

    async def check(self, call: Call) -> bytes:
        async def answer() -> Message:
            request = _parsed(AuthzRequest, call)
            caller = self.decider.gate.caller(call)
            asked = self._call(request.attributes)
            if asked is None:
                return answers.ALLOWED  # an MCP route's request that calls no tool
            body, mcp = asked
            vouched_for = vouched(caller, body, f"header {self.user_header!r}")
            return answers.authorization_response(await self.decider.decide(vouched_for), mcp)

        def refuse(exc: Refused) -> Message:
            return answers.authorization_refusal(str(exc), exc.status)

        return await self.decider.serve("Check", answer, refuse)

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


def _path(module: Any, service: str, method: str) -> str:
    """A method's HTTP/2 path, `/package.Service/Method`, as the stubs name it."""
    found = module.DESCRIPTOR.services_by_name[service].methods_by_name[method]
    return f"/{found.containing_service.full_name}/{found.name}"


def build(app: Any, settings: Settings) -> UnaryServer:
    """The listener with both services, not yet listening (`start` binds it); its
    connections capped and timed as the HTTP listener's are."""
    tokens: Tokens = app.state.tokens
    decider = Decider(app, Gate(tokens, settings.insecure_no_auth))
    limits, _ = connection_limits(settings)  # a lowered cap is warned of by the HTTP side
    rate_limit = RateLimitService(decider)
    authorization = AuthorizationService(decider, settings.envoy_user_header)
    methods = {
        _path(rls_pb2, "RateLimitService", "ShouldRateLimit"): rate_limit.should_rate_limit,
        _path(external_auth_pb2, "Authorization", "Check"): authorization.check,
    }
    return UnaryServer(methods, ConnectionGate(limits))
