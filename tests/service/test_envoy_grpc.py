"""Envoy's two protocols against a real `ratewarden serve --grpc-port`, driven by the
protocols' own generated stubs (xds-protos over grpcio), as Envoy drives them.

What a rate limit service and an ext_authz service must do (docs/envoy.md): descriptors
merged into one call, decided as a `POST /v1/check` is (one counter with it); OVER_LIMIT
with the limit, the headers and the sentence; a tool error for an MCP `tools/call`;
every request authenticated, every name validated; and nothing a hostile request sends
counted, logged as arguments, or able to stop the listener. The real Envoy in front is
tests/hosts/test_envoy*.py's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from envoy.extensions.common.ratelimit.v3.ratelimit_pb2 import RateLimitDescriptor
from envoy.service.auth.v3 import external_auth_pb2 as authz
from envoy.service.auth.v3 import external_auth_pb2_grpc as authz_grpc
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from google.protobuf import struct_pb2

from tests.helpers.daemon import Daemon, clean_environment, running_daemon
from tests.helpers.redis_server import free_port

SERVICE, VIEWER, LIMITED = "svc-token-1", "viewer-token-1", "limited-token-1"
POLICY = """\
version: 1
tools:
  read_file: {read_only: true}
rules:
  - name: terminal-per-minute
    match: {tool: terminal}
    per: [user]
    rate: 10/minute
  - name: no-root-delete
    match: {tool: terminal, args: {command: {regex: 'rm\\s+-rf\\s+/'}}}
    deny: "Refusing to delete the root directory"
  - name: no-sevens
    match: {tool: dice, args: {n: {in: [7]}}}
    deny: "No sevens"
  - name: closed-domain
    match: {tags: ["domain:closed"]}
    deny: "This gateway is closed"
  - name: demo-mode
    match: {read_only: false, user: "demo-*"}
    deny: "Demo mode: only read-only tools are available"
  - name: approve-deploys
    match: {tool: deploy}
    ask: "Deploys need a human's approval"
  - name: paid-search
    match: {tool: paid_search}
    per: [user]
    budget: 1.00/day
  - name: model-spend
    match: {kind: model}
    per: [user]
    budget: 5.00/day
  - name: model-tokens
    match: {model: "claude-*"}
    per: [user]
    rate: 1000 tokens/minute
"""
MINUTE = "Rate limit: max 10 terminal calls per minute"
Entry = RateLimitDescriptor.Entry


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, int]]:
    directory = tmp_path_factory.mktemp("envoy-grpc")
    (directory / "policy.yaml").write_text(POLICY)
    grpc_port = free_port()
    env = clean_environment(
        RATEWARDEN_API_TOKENS=f"{SERVICE},{LIMITED}",
        RATEWARDEN_API_TOKEN_USERS="*,team-a-*",
        RATEWARDEN_VIEWER_TOKENS=VIEWER,
    )
    flags = ("--policy", "policy.yaml", "--grpc-port", str(grpc_port))
    with running_daemon(directory, *flags, env=env) as served:
        yield served, grpc_port


@pytest.fixture
def channel(daemon: tuple[Daemon, int]) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{daemon[1]}") as opened:
        yield opened


def descriptor(**entries: str) -> RateLimitDescriptor:
    return RateLimitDescriptor(entries=[Entry(key=k, value=v) for k, v in entries.items()])


def should(
    channel: grpc.Channel, *descriptors: RateLimitDescriptor, token: str = SERVICE, **fields: Any
) -> rls_pb2.RateLimitResponse:
    stub = rls_pb2_grpc.RateLimitServiceStub(channel)
    fields.setdefault("domain", "agents")
    request = rls_pb2.RateLimitRequest(descriptors=descriptors, **fields)
    metadata = [("authorization", f"Bearer {token}")] if token else []
    answer: rls_pb2.RateLimitResponse = stub.ShouldRateLimit(request, metadata=metadata, timeout=10)
    return answer


def refused(call: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        call()
    return raised.value


def headers(answer: rls_pb2.RateLimitResponse) -> dict[str, str]:
    return {h.key: h.value for h in answer.response_headers_to_add}


def http_check(daemon: Daemon, **body: Any) -> dict[str, Any]:
    with httpx.Client(trust_env=False, timeout=10) as http:
        answer = http.post(
            f"{daemon.url}/v1/check", json=body, headers={"Authorization": f"Bearer {SERVICE}"}
        )
    found: dict[str, Any] = answer.raise_for_status().json()
    return found


# The rate limit service -----------------------------------------------------------------


def test_the_eleventh_call_is_over_the_limit_with_the_sentence(channel: grpc.Channel) -> None:
    one = descriptor(user="rls-alice", tool="terminal")
    answers = [should(channel, one) for _ in range(10)]
    assert {a.overall_code for a in answers} == {rls_pb2.RateLimitResponse.OK}
    assert headers(answers[-1])["x-ratelimit-remaining"] == "0"
    assert headers(answers[0])["x-ratelimit-limit"] == "10"
    assert 0 < int(headers(answers[0])["x-ratelimit-reset"]) <= 60  # the window's end
    assert answers[0].statuses[0].duration_until_reset.ToMilliseconds() > 0
    eleventh = should(channel, one)
    assert eleventh.overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT
    assert eleventh.raw_body.decode().startswith(MINUTE)
    status = eleventh.statuses[0]
    assert status.code == rls_pb2.RateLimitResponse.OVER_LIMIT
    assert (status.current_limit.name, status.current_limit.requests_per_unit) == (
        "terminal-per-minute", 10)  # fmt: skip
    assert status.current_limit.unit == rls_pb2.RateLimitResponse.RateLimit.MINUTE
    assert 0 < status.duration_until_reset.ToMilliseconds() <= 60_000
    assert int(headers(eleventh)["retry-after"]) > 0
    # Another user is not touched.
    other = should(channel, descriptor(user="rls-bob", tool="terminal"))
    assert other.overall_code == rls_pb2.RateLimitResponse.OK


def test_all_descriptors_are_one_call_with_a_status_each(channel: grpc.Channel) -> None:
    """Envoy sends one descriptor per rate_limits action set: they describe one request,
    counted once, not once per descriptor."""
    user, tool = descriptor(user="rls-carol"), descriptor(user="rls-carol", tool="terminal")
    for _ in range(10):
        answer = should(channel, user, tool, descriptor(tool="terminal", tag="north"))
        assert answer.overall_code == rls_pb2.RateLimitResponse.OK
        assert len(answer.statuses) == 3
    assert should(channel, tool).overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT


def test_the_domain_is_a_tag_a_rule_can_select(channel: grpc.Channel) -> None:
    one = descriptor(user="rls-dom", tool="web_search")
    closed = should(channel, one, domain="closed")
    assert closed.overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT
    assert closed.raw_body.decode() == "This gateway is closed"
    assert should(channel, one, domain="agents").overall_code == rls_pb2.RateLimitResponse.OK


def test_one_counter_with_the_http_api(daemon: tuple[Daemon, int], channel: grpc.Channel) -> None:
    for _ in range(6):
        assert http_check(daemon[0], user="rls-dana", tool="terminal")["decision"] == "allow"
    one = descriptor(user="rls-dana", tool="terminal")
    assert [should(channel, one).overall_code for _ in range(4)] == [
        rls_pb2.RateLimitResponse.OK
    ] * 4
    assert should(channel, one).overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT
    refusal = http_check(daemon[0], user="rls-dana", tool="terminal")
    assert refusal["decision"] == "deny"
    assert refusal["message"].startswith(MINUTE)


def test_hits_addend_is_a_tools_cost_in_millionths(
    daemon: tuple[Daemon, int], channel: grpc.Channel
) -> None:
    """A budget is charged the cost at once (Envoy never settles): 0.30 three times, then
    the fourth would pass 1.00."""
    one = descriptor(user="rls-erin", tool="paid_search")
    for _ in range(3):
        assert (
            should(channel, one, hits_addend=300_000).overall_code == rls_pb2.RateLimitResponse.OK
        )
    usage = read_usage_as_admin(daemon[0], "rls-erin", "paid_search")["paid-search"]
    assert (usage["used"], usage["reserved"]) == (pytest.approx(0.9), 0)
    fourth = should(channel, one, hits_addend=300_000)
    assert fourth.overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT
    assert "Budget" in fourth.raw_body.decode()
    # A descriptor's own hits_addend counts too (the largest given).
    small = RateLimitDescriptor(entries=one.entries)
    small.hits_addend.value = 50_000
    assert should(channel, small).overall_code == rls_pb2.RateLimitResponse.OK


def test_a_model_descriptor_is_a_model_call_of_its_input_tokens(
    daemon: tuple[Daemon, int], channel: grpc.Channel
) -> None:
    one = descriptor(user="rls-fay", model="gpt-4o")
    assert should(channel, one, hits_addend=1000).overall_code == rls_pb2.RateLimitResponse.OK
    usage = read_usage_as_admin(daemon[0], "rls-fay", None)["model-spend"]
    assert usage["used"] > 0
    assert usage["reserved"] == 0
    huge = should(channel, one, hits_addend=10**8)  # 100 M input tokens: past 5.00
    assert huge.overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT


def test_a_model_descriptors_tokens_count_on_its_token_rate(channel: grpc.Channel) -> None:
    """The gateway measured the tokens (Envoy AI Gateway sets hits_addend from them): they
    are charged and counted at once, so the window that holds 1 000 refuses the third."""
    one = descriptor(user="rls-gil", model="claude-sonnet-4-5")
    assert should(channel, one, hits_addend=600).overall_code == rls_pb2.RateLimitResponse.OK
    assert should(channel, one, hits_addend=600).overall_code == rls_pb2.RateLimitResponse.OK
    third = should(channel, one, hits_addend=10)
    assert third.overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT
    assert "tokens" in third.raw_body.decode()


def read_usage_as_admin(daemon: Daemon, user: str, tool: str | None) -> dict[str, Any]:
    params = {"user": user} if tool is None else {"user": user, "tool": tool}
    with httpx.Client(trust_env=False, timeout=10) as http:
        found = http.get(
            f"{daemon.url}/v1/usage", params=params, headers={"Authorization": f"Bearer {VIEWER}"}
        )
    return {item["rule"]: item for item in found.raise_for_status().json()["limits"]}


HOSTILE = [
    ([], "descriptors"),
    ([descriptor(usr="x", tool="terminal")], "'usr'"),
    ([descriptor(tool="terminal")], "user"),
    ([descriptor(user="x")], "tool"),
    ([descriptor(user="a", tool="terminal"), descriptor(user="b")], "'user'"),
    ([descriptor(user="x" * 10_000, tool="terminal")], "user"),
    ([descriptor(user="x", tool="terminal", read_only="yes")], "read_only"),
    ([descriptor(user="x", model="gpt-4o", tool="terminal")], "tool"),
    ([descriptor(user="x", tool="terminal", tag="t" * 1000)], "tag"),
    ([descriptor(user="x", model="gpt-4o", tag="a")], "tag"),
]


@pytest.mark.parametrize(("descriptors", "named"), HOSTILE)
def test_a_request_naming_no_call_is_invalid_and_counts_nothing(
    daemon: tuple[Daemon, int], channel: grpc.Channel, descriptors: list[Any], named: str
) -> None:
    """Refused in the protocol, not with a gRPC error, which Envoy answers by its failure
    mode (by default: let it through): a client able to make a descriptor invalid would
    pass unlimited. The log and the metric say INVALID_ARGUMENT."""
    answer = should(channel, *descriptors)
    assert answer.overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT
    why = answer.raw_body.decode()
    assert why.startswith("ratewarden could not check this request: ")
    assert named in why
    assert "refused (INVALID_ARGUMENT)" in daemon[0].log_text()  # a log line says why
    # The listener still answers, and nothing was counted for anyone named.
    assert should(channel, descriptor(user="x", tool="terminal")).overall_code in (
        rls_pb2.RateLimitResponse.OK, rls_pb2.RateLimitResponse.OVER_LIMIT)  # fmt: skip


def test_many_descriptors_are_one_call_or_refused_never_a_crash(channel: grpc.Channel) -> None:
    wide = [descriptor(user="rls-wide", tool="terminal", tag=f"t{i}") for i in range(31)]
    assert should(channel, *wide).overall_code == rls_pb2.RateLimitResponse.OK  # + domain: 32
    many = [descriptor(user="rls-wide", tool="terminal", tag=f"t{i}") for i in range(5000)]
    answer = should(channel, *many)
    assert answer.overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT
    assert "'tag'" in answer.raw_body.decode()


def test_names_are_held_to_the_http_apis_rules(
    daemon: tuple[Daemon, int], channel: grpc.Channel
) -> None:
    """A name the HTTP API takes (shown escaped wherever it is shown) is taken, one it
    refuses is refused: the same CheckRequest validates both."""
    for user in ("rls-x\x00y", "rls-\u202eevil"):
        assert should(channel, descriptor(user=user, tool="terminal")).overall_code == (
            rls_pb2.RateLimitResponse.OK)  # fmt: skip
        assert http_check(daemon[0], user=user, tool="terminal")["decision"] == "allow"


def test_the_credential_says_who_may_be_named(channel: grpc.Channel) -> None:
    one = descriptor(user="rls-gus", tool="terminal")
    assert refused(lambda: should(channel, one, token="")).code() == (
        grpc.StatusCode.UNAUTHENTICATED)  # fmt: skip
    assert refused(lambda: should(channel, one, token="wrong")).code() == (
        grpc.StatusCode.UNAUTHENTICATED)  # fmt: skip
    viewer = refused(lambda: should(channel, one, token=VIEWER))
    assert viewer.code() == grpc.StatusCode.PERMISSION_DENIED
    # A service token limited to team-a-* users vouches for them only.
    other = should(channel, one, token=LIMITED)  # refused in the protocol: Envoy's fail
    assert other.overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT  # mode never sees it
    assert "team-a-*" in other.raw_body.decode()
    mine = should(channel, descriptor(user="team-a-hal", tool="terminal"), token=LIMITED)
    assert mine.overall_code == rls_pb2.RateLimitResponse.OK


# External authorization -----------------------------------------------------------------


def check(
    channel: grpc.Channel,
    *,
    user: str | None,
    extensions: dict[str, str] | None = None,
    mcp: dict[str, Any] | None = None,
    body: bytes = b"",
    content_type: str = "application/json",
    token: str = SERVICE,
) -> authz.CheckResponse:
    request = authz.CheckRequest()
    http = request.attributes.request.http
    if user is not None:
        http.headers["x-ratewarden-user"] = user
    http.headers["content-type"] = content_type
    if body:
        http.raw_body = body
    for key, value in (extensions or {}).items():
        request.attributes.context_extensions[key] = value
    if mcp is not None:
        namespace = struct_pb2.Struct()
        namespace.update(mcp)
        request.attributes.metadata_context.filter_metadata["envoy.filters.http.mcp"].CopyFrom(
            namespace
        )
    stub = authz_grpc.AuthorizationStub(channel)
    answer: authz.CheckResponse = stub.Check(
        request, metadata=[("authorization", f"Bearer {token}")], timeout=10
    )
    return answer


def denied(answer: authz.CheckResponse) -> tuple[int, dict[str, Any]]:
    assert answer.status.code != 0, "allowed"
    return answer.denied_response.status.code, json.loads(answer.denied_response.body)


def tools_call(
    name: str, arguments: dict[str, Any] | None = None, id_: float = 3.0, **more: Any
) -> dict[str, Any]:
    """The MCP filter's metadata for a tools/call, as Envoy 1.40 gives it: nested under
    `params`, the id a float (tests/hosts/test_envoy*.py read it from the real filter)."""
    params: dict[str, Any] = {"name": name}
    if arguments is not None:
        params["arguments"] = arguments
    return {"is_mcp_request": True, "status": "mcp_ok", "jsonrpc": "2.0",
            "method": "tools/call", "id": id_, "params": params, **more}  # fmt: skip


def test_a_plain_request_names_its_tool_in_the_routes_extensions(channel: grpc.Channel) -> None:
    route = {"tool": "terminal"}
    for _ in range(10):
        assert check(channel, user="az-ann", extensions=route).status.code == 0
    status, body = denied(check(channel, user="az-ann", extensions=route))
    assert status == 429
    assert body["error"] == "rate_limited"
    assert body["message"].startswith(MINUTE)


def test_an_mcp_tool_call_is_refused_as_a_tool_result(channel: grpc.Channel) -> None:
    for _ in range(10):
        assert check(channel, user="az-ben", mcp=tools_call("terminal")).status.code == 0
    status, body = denied(check(channel, user="az-ben", mcp=tools_call("terminal", id_=17.0)))
    assert status == 200  # a JSON-RPC answer, which the client reads as the tool's result
    assert body["id"] == 17
    assert isinstance(body["id"], int)
    assert body["result"]["isError"] is True
    assert body["result"]["content"][0]["text"].startswith(MINUTE)


def test_other_mcp_messages_pass_uncounted(
    daemon: tuple[Daemon, int], channel: grpc.Channel
) -> None:
    for method in ("initialize", "tools/list", "notifications/initialized", "ping"):
        assert check(channel, user="az-cy", mcp={"method": method, "id": 1.0}).status.code == 0
    assert read_usage_as_admin(daemon[0], "az-cy", "terminal")["terminal-per-minute"]["used"] == 0


def test_arguments_reach_the_policy(channel: grpc.Channel) -> None:
    bad = check(channel, user="az-dee", mcp=tools_call("terminal", {"command": "rm -rf /"}))
    status, body = denied(bad)
    assert (status, body["result"]["content"][0]["text"]) == (
        200, "Refusing to delete the root directory")  # fmt: skip
    fine = check(channel, user="az-dee", mcp=tools_call("terminal", {"command": "ls /"}))
    assert fine.status.code == 0


def test_the_body_carries_the_call_where_no_mcp_filter_runs(channel: grpc.Channel) -> None:
    rpc = {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
           "params": {"name": "terminal", "arguments": {"command": "rm -rf /"}}}  # fmt: skip
    status, body = denied(check(channel, user="az-eve", body=json.dumps(rpc).encode()))
    assert (status, body["id"]) == (200, 5)
    assert body["result"]["content"][0]["text"] == "Refusing to delete the root directory"


def test_the_catalogue_classifies_for_a_demo(channel: grpc.Channel) -> None:
    assert check(channel, user="demo-fin", mcp=tools_call("read_file")).status.code == 0
    _status, body = denied(check(channel, user="demo-fin", mcp=tools_call("delete_file")))
    assert body["result"]["content"][0]["text"] == "Demo mode: only read-only tools are available"


def test_an_ask_is_a_refusal_saying_approval_is_needed(channel: grpc.Channel) -> None:
    status, body = denied(check(channel, user="az-gil", extensions={"tool": "deploy"}))
    assert status == 403
    assert body == {"error": "forbidden",
                    "message": "Approval needed: Deploys need a human's approval"}  # fmt: skip


INVALID_CHECKS: list[tuple[dict[str, Any], str]] = [
    ({"user": None, "extensions": {"tool": "terminal"}}, "x-ratewarden-user"),
    ({"user": "az-h", "mcp": {"method": "tools/call", "id": 1.0}}, "params.name"),
    ({"user": "az-h", "body": b"{not json"}, "not JSON"),
    ({"user": "az-h", "body": b"[" * 100_000 + b"]" * 100_000}, "not JSON"),
    ({"user": "az-h", "body": b'[{"jsonrpc": "2.0", "method": "tools/call"}]'}, "batch"),
    ({"user": "az-h", "extensions": {"tool": "x" * 5000}}, "context extension 'tool'"),
]


@pytest.mark.parametrize(("fields", "named"), INVALID_CHECKS)
def test_a_check_naming_no_call_is_invalid(
    daemon: tuple[Daemon, int], channel: grpc.Channel, fields: dict[str, Any], named: str
) -> None:
    status, body = denied(check(channel, **fields))
    assert (status, body["error"]) == (400, "invalid_request")
    assert body["message"].startswith("ratewarden could not check this request: ")
    assert named in body["message"]
    assert "envoy Check refused (INVALID_ARGUMENT)" in daemon[0].log_text()


def test_an_mcp_routes_other_requests_pass(
    daemon: tuple[Daemon, int], channel: grpc.Channel
) -> None:
    """The session's stream (GET) and end (DELETE) reach ext_authz with no MCP metadata
    and no body: on a route that names no tool they call no tool, and pass uncounted."""
    assert check(channel, user="az-jo").status.code == 0
    assert check(channel, user="az-jo", body=b'{"some": "json"}').status.code == 0
    usage = read_usage_as_admin(daemon[0], "az-jo", "terminal")["terminal-per-minute"]
    assert usage["used"] == 0


def test_arguments_past_the_filters_body_limit_are_read_as_cut(channel: grpc.Channel) -> None:
    """Envoy's MCP filter forwards a tools/call whose body passed its limit with the
    arguments it parsed so far (`is_exceeding_limit`): padding first hides `rm -rf /`
    from the metadata, so the arguments are read as cut, and the rule on them holds."""
    padded = tools_call(
        "terminal", {}, is_exceeding_limit=True, passthrough_reason="mcp_body_too_large"
    )
    status, body = denied(check(channel, user="az-kai", mcp=padded))
    assert status == 200
    assert body["result"]["content"][0]["text"] == "Refusing to delete the root directory"
    whole = tools_call("terminal", {"command": "ls"})
    assert check(channel, user="az-kai", mcp=whole).status.code == 0


def test_a_message_past_the_filters_limit_that_is_no_tool_call_is_refused(
    channel: grpc.Channel,
) -> None:
    """Padding before `method`: the filter stops reading before it knows the request is a
    tools/call (tests/hosts/test_envoy.py ran `rm -rf /` so before this answer)."""
    unknown = {"is_mcp_request": True, "status": "mcp_ok", "jsonrpc": "2.0", "id": 7.0,
               "is_exceeding_limit": True, "passthrough_reason": "mcp_body_too_large"}  # fmt: skip
    status, body = denied(check(channel, user="az-kai", mcp=unknown))
    assert (status, body["error"]) == (413, "too_large")
    assert "too large to check" in body["message"]
    seen = {**unknown, "method": "initialize"}  # read before the limit: it is what it says
    assert check(channel, user="az-kai", mcp=seen).status.code != 0  # and large: refused too


def test_large_arguments_are_sent_bounded_not_refused(channel: grpc.Channel) -> None:
    """A legitimate call with 100 KB of arguments is decided on a bounded copy (as every
    client sends), not refused for its size; the rule still reads its command."""
    big = {"command": "rm -rf /", "content": "x" * 100_000}
    status, body = denied(check(channel, user="az-lu", mcp=tools_call("terminal", big)))
    assert status == 200
    assert body["result"]["content"][0]["text"] == "Refusing to delete the root directory"
    fine = {"command": "cat", "content": "x" * 100_000}
    assert check(channel, user="az-lu", mcp=tools_call("terminal", fine)).status.code == 0


def test_whole_numbers_from_the_filter_are_ints_again(channel: grpc.Channel) -> None:
    """Struct holds 7 as 7.0: made 7 again, so `in: [7]` reads it as the client sent it."""
    status, body = denied(check(channel, user="az-mo", mcp=tools_call("dice", {"n": 7.0})))
    assert status == 200
    assert body["result"]["content"][0]["text"] == "No sevens"
    assert check(channel, user="az-mo", mcp=tools_call("dice", {"n": 7.5})).status.code == 0


def test_nested_and_odd_arguments_are_decided(channel: grpc.Channel) -> None:
    nested: dict[str, Any] = {"a": [[[[[[]]]]]] * 10, "n": 1.5, "none": None}
    assert check(channel, user="az-h", mcp=tools_call("terminal", nested)).status.code == 0
    wrapped = check(channel, user="az-h", mcp=tools_call("terminal", {"command": "rm  -rf   /"}))
    assert wrapped.status.code != 0  # padded spaces do not slip past the rule


def test_ext_authz_is_authenticated_too(channel: grpc.Channel) -> None:
    plain: dict[str, Any] = {"user": "az-ivy", "extensions": {"tool": "terminal"}}
    assert refused(lambda: check(channel, token="nope", **plain)).code() == (
        grpc.StatusCode.UNAUTHENTICATED)  # fmt: skip
    status, body = denied(check(channel, token=LIMITED, **plain))
    assert (status, body["error"]) == (403, "forbidden")
    assert "team-a-*" in body["message"]


def test_the_http_api_is_unchanged_and_the_listener_is_off_by_default(tmp_path: Path) -> None:
    with running_daemon(tmp_path) as plain:
        assert "grpc" not in plain.log_text()
        with httpx.Client(trust_env=False) as http:
            answer = http.post(f"{plain.url}/v1/check", json={"user": "u", "tool": "t"})
        assert answer.json()["decision"] == "allow"


def answers_counted(daemon: Daemon, method: str, code: str) -> float:
    """ratewarden_grpc_answers_total{method, code}, as /metrics says it now."""
    with httpx.Client(trust_env=False, timeout=10) as http:
        text = http.get(f"{daemon.url}/metrics").text
    series = f'ratewarden_grpc_answers_total{{code="{code}",method="{method}"}} '
    lines = [line for line in text.splitlines() if line.startswith(series)]
    return float(lines[0].split()[-1]) if lines else 0.0


def test_every_answer_is_counted_by_method_and_status(
    daemon: tuple[Daemon, int], channel: grpc.Channel
) -> None:
    def counted(method: str, code: str) -> float:
        return answers_counted(daemon[0], method, code)

    before = {k: counted(*k) for k in [("ShouldRateLimit", "OK"), ("ShouldRateLimit",
              "INVALID_ARGUMENT"), ("Check", "OK"), ("Check", "UNAUTHENTICATED")]}  # fmt: skip
    should(channel, descriptor(user="m-1", tool="terminal"))
    should(channel, descriptor(user="m-1"))  # no tool: refused, counted as invalid
    check(channel, user="m-1", extensions={"tool": "terminal"})
    refused(lambda: check(channel, user="m-1", extensions={"tool": "t"}, token="bad"))
    after = {k: counted(*k) for k in before}
    assert {k: after[k] - before[k] for k in before} == dict.fromkeys(before, 1.0)


def test_raw_headers_are_read_too(channel: grpc.Channel) -> None:
    """With `encode_raw_headers`, Envoy sends `header_map` (bytes) instead of `headers`."""
    request = authz.CheckRequest()
    raw = request.attributes.request.http.header_map.headers
    raw.add(key="x-ratewarden-user", raw_value=b"az-raw")
    raw.add(key="content-type", raw_value=b"application/json")
    request.attributes.context_extensions["tool"] = "deploy"
    stub = authz_grpc.AuthorizationStub(channel)
    answer = stub.Check(request, metadata=[("authorization", f"Bearer {SERVICE}")], timeout=10)
    status, body = denied(answer)
    assert status == 403
    assert body["message"] == "Approval needed: Deploys need a human's approval"


@pytest.mark.parametrize(
    ("method", "kind"),
    [("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", "RateLimitRequest"),
     ("/envoy.service.auth.v3.Authorization/Check", "CheckRequest")],
)  # fmt: skip
def test_a_message_that_is_not_the_protocols_is_refused_in_it(
    daemon: tuple[Daemon, int], channel: grpc.Channel, method: str, kind: str
) -> None:
    """Bytes that do not parse as the method's message: refused in the protocol (so
    Envoy's failure mode cannot let them through), counted as INVALID_ARGUMENT (and
    logged, at most once per 10 s: RefusalLog), and the listener goes on."""
    named = method.rpartition("/")[2]
    before = answers_counted(daemon[0], named, "INVALID_ARGUMENT")
    raw = channel.unary_unary(method)  # bytes in, bytes out
    metadata = (("authorization", f"Bearer {SERVICE}"),)
    answer = raw(b"\xff\xff\xff\xff", metadata=metadata, timeout=10)
    if kind == "RateLimitRequest":
        refusal = rls_pb2.RateLimitResponse.FromString(answer)
        assert refusal.overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT
        said = refusal.raw_body.decode()
    else:
        status, body = denied(authz.CheckResponse.FromString(answer))
        assert status == 400
        said = body["message"]
    assert said.endswith(f"the request is not a {kind}")
    assert answers_counted(daemon[0], named, "INVALID_ARGUMENT") == before + 1
    assert should(channel, descriptor(user="after-junk", tool="terminal")).overall_code == (
        rls_pb2.RateLimitResponse.OK)  # fmt: skip


def test_a_method_the_listener_does_not_serve_is_unimplemented(channel: grpc.Channel) -> None:
    unknown = channel.unary_unary("/envoy.service.ratelimit.v2.RateLimitService/ShouldRateLimit")
    assert refused(lambda: unknown(b"", timeout=10)).code() == grpc.StatusCode.UNIMPLEMENTED
