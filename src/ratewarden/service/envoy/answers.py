"""A decision as each protocol answers it (docs/envoy.md, "What the client sees").

The rate limit service answers OK or OVER_LIMIT, a status per descriptor, the
`x-ratelimit-*` headers and ratewarden's sentence as the body Envoy sends back
(`raw_body`). External authorization answers OK, or a denied response: for an MCP tool
call a JSON-RPC result with `isError: true` (so the model reads the sentence as the tool's
result, as through the MCP gateway), for anything else JSON `{"error", "message"}`.
"""

from __future__ import annotations

import json
import math

from envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
from envoy.service.auth.v3.external_auth_pb2 import CheckResponse, DeniedHttpResponse
from envoy.service.ratelimit.v3.rls_pb2 import RateLimitResponse
from envoy.type.v3.http_status_pb2 import HttpStatus
from google.rpc import code_pb2, status_pb2

from ratewarden.engine import Decision
from ratewarden.engine.decision import Verdict
from ratewarden.service.envoy.calls import McpCall
from ratewarden.vocabulary import UNAVAILABLE, RuleKind

Code = RateLimitResponse.Code
Unit = RateLimitResponse.RateLimit.Unit
UNITS = {"second": Unit.SECOND, "minute": Unit.MINUTE, "hour": Unit.HOUR, "day": Unit.DAY}
ASK = "Approval needed: {message}"  # an `ask` through Envoy, which cannot ask anyone
TEXT = "text/plain; charset=utf-8"
JSON = "application/json"


def sentence(decision: Decision) -> str:
    """What the client reads: the decision's sentence, an `ask` saying approval is needed."""
    if decision.decision == "ask":
        return ASK.format(message=decision.message)
    return decision.message


def binding(decision: Decision) -> Verdict | None:
    """The limit an answer describes: the refusing one, else the closest to its end."""
    if decision.violations:
        return decision.violations[0]
    counted = [v for v in decision.limits if v.kind == RuleKind.RATE and not v.tokens]
    return min(counted, key=lambda v: v.remaining / v.limit if v.limit else 0, default=None)


def ratelimit_response(decision: Decision, descriptors: int) -> RateLimitResponse:
    """OK or OVER_LIMIT for every descriptor, with the limit's figures and the sentence."""
    code = Code.OK if decision.allowed else Code.OVER_LIMIT
    verdict = binding(decision)
    status = RateLimitResponse.DescriptorStatus(code=code)
    headers = []
    if verdict is not None:
        _describe(status, verdict)
        headers = _ratelimit_headers(verdict)
    answer = RateLimitResponse(overall_code=code, statuses=[status] * max(descriptors, 1))
    if not decision.allowed:
        if decision.retry_after:
            headers.append(("retry-after", str(math.ceil(decision.retry_after))))
        headers.append(("content-type", TEXT))
        answer.raw_body = sentence(decision).encode()
    answer.response_headers_to_add.extend(HeaderValue(key=k, value=v) for k, v in headers)
    return answer


def _describe(status: RateLimitResponse.DescriptorStatus, verdict: Verdict) -> None:
    unit = UNITS.get(verdict.window or "")
    if unit is not None and isinstance(verdict.limit, int):
        status.current_limit.CopyFrom(
            RateLimitResponse.RateLimit(
                name=verdict.rule, requests_per_unit=verdict.limit, unit=unit
            )
        )
    if isinstance(verdict.remaining, int):
        status.limit_remaining = max(verdict.remaining, 0)
    wait = _wait(verdict)
    status.duration_until_reset.FromMilliseconds(int(wait * 1000))


UNCHECKED = "ratewarden could not check this request: {why}"


def ratelimit_refusal(why: str, descriptors: int) -> RateLimitResponse:
    """OVER_LIMIT for a request that names no call ratewarden can decide (calls.Refused)."""
    status = RateLimitResponse.DescriptorStatus(code=Code.OVER_LIMIT)
    answer = RateLimitResponse(
        overall_code=Code.OVER_LIMIT,
        statuses=[status] * max(descriptors, 1),
        raw_body=UNCHECKED.format(why=why).encode(),
    )
    answer.response_headers_to_add.append(HeaderValue(key="content-type", value=TEXT))
    return answer


def _wait(verdict: Verdict) -> float:
    """Seconds until the limit resets: a refusal's wait, else its window's end (an
    admitted verdict's retry_after is 0.0, not None)."""
    return verdict.retry_after or verdict.reset_after


def _ratelimit_headers(verdict: Verdict) -> list[tuple[str, str]]:
    """The draft RFC's headers (as envoyproxy/ratelimit sends them) for a counted limit."""
    if not isinstance(verdict.limit, int) or not isinstance(verdict.remaining, int):
        return []  # money: the sentence says it
    wait = _wait(verdict)
    return [
        ("x-ratelimit-limit", str(verdict.limit)),
        ("x-ratelimit-remaining", str(max(verdict.remaining, 0))),
        ("x-ratelimit-reset", str(math.ceil(wait))),
    ]


ALLOWED = CheckResponse(status=status_pb2.Status(code=code_pb2.OK))


def authorization_response(decision: Decision, mcp: McpCall | None) -> CheckResponse:
    """OK, or the denied response the client (and its model) reads."""
    if decision.allowed:
        return ALLOWED
    message = sentence(decision)
    if mcp is not None:  # a tool result, not an HTTP error: the model reads it
        status, body = 200, _tool_error(mcp, message)
    else:
        status = _http_status(decision)
        body = json.dumps({"error": ERRORS[status], "message": message})
    wait = decision.retry_after if mcp is None else None
    return _denied(status, body, message, wait)


def _denied(status: int, body: str, message: str, wait: float | None = None) -> CheckResponse:
    headers = [("content-type", JSON)]
    if wait:
        headers.append(("retry-after", str(math.ceil(wait))))
    return CheckResponse(
        status=status_pb2.Status(code=code_pb2.PERMISSION_DENIED, message=message),
        denied_response=DeniedHttpResponse(
            status=HttpStatus(code=status),
            headers=[HeaderValueOption(header=HeaderValue(key=k, value=v)) for k, v in headers],
            body=body,
        ),
    )


ERRORS = {429: "rate_limited", 403: "forbidden", 503: "unavailable"}
COUNTED = frozenset({RuleKind.RATE, RuleKind.CONCURRENCY, RuleKind.BUDGET})


def _http_status(decision: Decision) -> int:
    """429 for a limit, 403 for an access rule or an `ask`, 503 for the store down (a
    fail mode refused)."""
    if decision.decision == "ask":
        return 403
    kinds = {v.kind for v in decision.violations}
    if UNAVAILABLE in kinds:
        return 503
    return 429 if kinds & COUNTED else 403


REFUSALS = {400: "invalid_request", 403: "forbidden", 409: "call_id_conflict", 413: "too_large"}


def authorization_refusal(why: str, status: int) -> CheckResponse:
    """A denied response for a request that names no call ratewarden can decide."""
    message = UNCHECKED.format(why=why)
    return _denied(status, json.dumps({"error": REFUSALS[status], "message": message}), message)


def _tool_error(mcp: McpCall, message: str) -> str:
    result = {"content": [{"type": "text", "text": message}], "isError": True}
    return json.dumps({"jsonrpc": "2.0", "id": mcp.id, "result": result})
