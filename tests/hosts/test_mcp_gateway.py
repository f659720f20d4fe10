"""`ratewarden mcp --listen` (the shared gateway) between the MCP SDK's client and real
SDK servers, over streamable HTTP, in front of two daemons on one real Redis.

The gateway (`<mcp venv>/bin/ratewarden mcp --listen …`) fronts two upstreams: `demo`,
the test server started per session as a command (`drivers/mcp_server.py`), and `web`,
the same server already listening on streamable HTTP. Users are bearer tokens from a
tokens file; a second gateway takes them from a front proxy's header instead.
`drivers/mcp_gateway_client.py` (in the mcp venv) runs the scenarios and reports what the
clients received; the tests read that, what the tools wrote, and what the daemons counted.
"""

from __future__ import annotations

import contextlib
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.helpers.redis_server import free_port, running_redis
from tests.hosts.scenario import (
    DRIVERS,
    clean_environment,
    host_python,
    read_denials,
    read_usage,
    run_driver,
    running_daemon,
    started,
)

RATE_MESSAGE = "Rate limit: max 10 terminal calls per minute"
WEB_MESSAGE = "Rate limit: max 2 web.terminal calls per minute"
DEMO_MESSAGE = "Demo mode: destructive tools are off"
ASK_MESSAGE = "deploy needs a human's approval"
ARGS_MESSAGE = "Refusing destructive root delete"
USERS = [
    "gw-limit", "mcp-demo", "gw-budget", "gw-pass", "gw-ask", "gw-web", "gw-alice", "gw-bob",
    "gw-delete", "gw-drop", "gw-fresh", "gw-ask-raw", "gw-web-budget", "gw-web-pass",
    "gw-web-delete", "gw-demo-changed", "gw-web-changed", "gw-demo-args", "gw-web-args",
    "gw-forms", "gw-steps", "gw-web-steps",
]  # fmt: skip
IDLE_TIMEOUT_S = 3  # the main gateway's: a client that vanishes is let go this soon

# The daemon hears each tool as `server.tool`: rules target one server's tools by glob. The
# catalogue labels demo's terminal plainly, so its message reads as the stdio proxy's does.
POLICY = f"""\
version: 1
tools:
  demo.terminal: {{label: terminal}}
  demo.slow_paid: {{cost: 0.5}}
  web.slow_paid: {{cost: 0.5}}
rules:
  - name: terminal-per-minute
    match: {{tool: demo.terminal}}
    per: [user]
    rate: 10/minute
  - name: terminal-one-at-a-time
    match: {{tool: demo.terminal}}
    per: [user]
    concurrency: 1
  - name: web-per-minute
    match: {{tool: "web.*", user: gw-web}}
    per: [user]
    rate: 2/minute
  - name: demo-mode
    match: {{user: [mcp-demo, gw-demo-changed, gw-web-changed], destructive: true}}
    deny: "{DEMO_MESSAGE}"
  - name: paid-budget
    match: {{tool: [demo.slow_paid, web.slow_paid]}}
    per: [user]
    budget: 100/day
  - name: paid-one-at-a-time
    match: {{tool: [demo.slow_paid, demo.failing, web.slow_paid, web.failing]}}
    per: [user]
    concurrency: 1
  - name: hang-one-at-a-time
    match: {{tool: [demo.hang, web.hang]}}
    per: [user]
    concurrency: 1
  - name: no-root-delete
    match: {{tool: [demo.terminal, web.terminal], args: {{command: {{contains: "rm -rf /"}}}}}}
    deny: "{ARGS_MESSAGE}"
  - name: deploy-needs-approval
    match: {{tool: demo.deploy}}
    ask: "{ASK_MESSAGE}"
"""


class Run:
    def __init__(self, daemons: list[str], report: dict[str, Any], after: dict[str, Any]) -> None:
        self.daemons, self.report, self.after = daemons, report, after

    def usage(self, user: str) -> dict[str, dict[str, Any]]:
        return read_usage(self.daemons[-1], user)

    def denials(self, user: str) -> list[dict[str, Any]]:
        return read_denials(self.daemons[-1], user)


def checks_decided(daemon: str) -> float:
    """The checks this daemon decided, from its /metrics."""
    text = httpx.get(f"{daemon}/metrics", trust_env=False).text
    return sum(float(m) for m in re.findall(r"^ratewarden_checks_total\{.*\} (\S+)$", text, re.M))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    python = host_python("mcp")
    work = tmp_path_factory.mktemp("mcp-gateway")
    tokens = {user: f"token-for-{user}-0123456789" for user in USERS}
    (work / "tokens.yaml").write_text(yaml.safe_dump(tokens))
    env = clean_environment()
    server = [str(python), str(DRIVERS / "mcp_server.py")]
    web_port, gateway_port, header_port = free_port(), free_port(), free_port()
    with contextlib.ExitStack() as stack:
        redis = stack.enter_context(running_redis(work))
        daemons = [
            stack.enter_context(
                running_daemon(POLICY, work / f"daemon-{i}", "--store-url", redis.url)
            )
            for i in (1, 2)
        ]
        stack.enter_context(
            started(
                [*server, "--http", str(web_port)],
                {**env, "MCP_RAN": str(work / "web.ran")},
                f"http://127.0.0.1:{web_port}/mcp",
                work / "web.log",
            )
        )
        gateway = [str(python.parent / "ratewarden"), "mcp"]
        demo = f"demo={' '.join(server)}"
        env_demo = {**env, "MCP_RAN": str(work / "demo.ran")}
        stack.enter_context(  # the main gateway, asking both daemons
            started(
                [*gateway, "--listen", f"127.0.0.1:{gateway_port}",
                 "--server", demo, "--server", f"web=http://127.0.0.1:{web_port}/mcp",
                 "--tokens", str(work / "tokens.yaml"),
                 "--url", daemons[0].url, "--url", daemons[1].url,
                 "--idle-timeout", str(IDLE_TIMEOUT_S)],
                env_demo,
                f"http://127.0.0.1:{gateway_port}/healthz",
                work / "gateway.log",
            )
        )  # fmt: skip
        stack.enter_context(
            started(
                [*gateway, "--listen", f"127.0.0.1:{header_port}", "--server", demo,
                 "--user-header", "X-User", "--url", daemons[1].url],
                {**env_demo, "RATEWARDEN_REQUEST_TIMEOUT_S": "1"},
                f"http://127.0.0.1:{header_port}/healthz",
                work / "header-gateway.log",
            )
        )  # fmt: skip
        config = {
            "gateway": f"http://127.0.0.1:{gateway_port}",
            "header_gateway": f"http://127.0.0.1:{header_port}",
            "tokens": tokens,
            "work": str(work),
        }
        report = drive(python, {**config, "phase": "all"})
        report["half_open"] = half_open(header_port)
        urls = [daemon.url for daemon in daemons]
        report["checks_by_daemon"] = [checks_decided(url) for url in urls]
        wait_for_release(urls[-1], "gw-drop", "hang-one-at-a-time", IDLE_TIMEOUT_S + 20)
        report["gateway_log"] = (work / "gateway.log").read_text(errors="replace")
        daemons[0].process.terminate()  # one daemon goes: the gateway asks the other
        daemons[0].process.wait(timeout=20)
        after = drive(python, {**config, "phase": "one daemon gone"})
        yield Run(urls, report, after)


def half_open(port: int, count: int = 20) -> dict[str, Any]:
    """Sockets that start a request and never finish it (headers cut short, or a body
    promised and not sent): the gateway must close them itself, and serve meanwhile."""
    openings = [b"POST /demo/mcp HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
                b"GET /healthz HTTP/1.1\r\nHo"]  # fmt: skip
    held = []
    for n in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(openings[n % 2])
        held.append(sock)
    healthy = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5, trust_env=False)
    deadline, closed = time.monotonic() + 30, 0
    for sock in held:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        with contextlib.suppress(OSError):
            if sock.recv(1) == b"":  # the gateway hung up on it, unanswered
                closed += 1
        sock.close()
    return {"healthy_meanwhile": healthy.status_code, "closed": closed, "count": count}


def drive(python: Path, config: dict[str, Any]) -> dict[str, Any]:
    report: dict[str, Any] = run_driver(
        python, DRIVERS / "mcp_gateway_client.py", config, timeout=300
    )
    return report


def wait_for_release(daemon: str, user: str, rule: str, seconds: float) -> None:
    """Until `user`'s slot of `rule` is free (a dropped client's call, settled when its
    session times out), or `seconds` pass; the test then reads the usage itself."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        usage = httpx.get(f"{daemon}/v1/usage", params={"user": user}, trust_env=False).json()
        if all(item["used"] == 0 for item in usage["limits"] if item["rule"] == rule):
            return
        time.sleep(0.2)


pytestmark = pytest.mark.timeout(900)  # the first run builds the host venv


def test_eleventh_call_over_http_is_an_error_result_and_ten_ran(run: Run) -> None:
    results = run.report["limit"]["results"]
    assert [r["text"] for r in results[:10]] == [f"ran echo L{i}" for i in range(1, 11)]
    assert not any(r["is_error"] for r in results[:10])
    assert results[10]["is_error"] is True
    assert results[10]["text"].startswith(RATE_MESSAGE), results[10]
    assert run.report["limit"]["ran"] == [f"terminal echo L{i}" for i in range(1, 11)]
    usage = run.usage("gw-limit")
    assert usage["terminal-per-minute"]["used"] == 10
    assert usage["terminal-one-at-a-time"]["used"] == 0  # each call was settled
    refused = run.denials("gw-limit")  # this one, and those after a daemon went
    assert {entry["tool"] for entry in refused} == {"demo.terminal"}  # it heard server.tool


def test_both_daemons_decided_and_one_counter_held(run: Run) -> None:
    first, second = run.report["checks_by_daemon"]
    assert first > 0
    assert second > 0  # the gateway spread its checks over both daemons on one Redis


def test_with_one_daemon_gone_the_other_decides(run: Run) -> None:
    # Not fail-open: every call of the user at the limit is refused by the live daemon.
    limited = run.after["limit"]["results"]
    assert all(r["is_error"] and r["text"].startswith(RATE_MESSAGE) for r in limited)
    assert len(run.after["limit"]["ran"]) == 10  # nothing more ran
    fresh = run.after["fresh"]["results"]
    assert [r["is_error"] for r in fresh] == [False] * 10 + [True]
    assert run.usage("gw-fresh")["terminal-per-minute"]["used"] == 10


def test_annotations_drive_an_access_rule_over_http(run: Run) -> None:
    access = run.report["access"]
    assert access["annotations"]["read_file"] == {"readOnlyHint": True}
    [drop] = access["drop"]
    assert drop["is_error"] is True
    assert drop["text"].startswith(DEMO_MESSAGE)
    assert access["read"] == [{"text": "contents of gw-README", "is_error": False}]
    assert access["ran"] == ["read_file gw-README"]


# Each upstream kind: a command (stdio, per session) and a URL (the gateway's own client).
UPSTREAMS = pytest.mark.parametrize("server", ["demo", "web"])


def scenario(run: Run, name: str, server: str) -> dict[str, Any]:
    found: dict[str, Any] = run.report[name if server == "demo" else f"{server}_{name}"]
    return found


@UPSTREAMS
def test_budget_is_reserved_and_settled_over_http(run: Run, server: str) -> None:
    budget = scenario(run, "budget", server)
    user = "gw-budget" if server == "demo" else "gw-web-budget"
    assert [r["text"] for r in budget["results"][:3]] == [f"bought {user} {i}" for i in range(3)]
    assert budget["results"][3]["is_error"] is True
    assert len(budget["ran"]) == 4
    usage = run.usage(user)
    assert usage["paid-budget"]["used"] == pytest.approx(1.5)
    assert not usage["paid-budget"]["reserved"]
    assert usage["paid-one-at-a-time"]["used"] == 0


@UPSTREAMS
def test_progress_elicitation_and_sampling_reach_the_http_client(run: Run, server: str) -> None:
    passed = scenario(run, "passthrough", server)
    topic = "gw-pass-dogs" if server == "demo" else "gw-web-pass-dogs"
    assert passed["resources"] == ["notes://today"]
    assert passed["read"] == ["today's notes"]
    assert passed["progress"] == [[0.5, 1.0, "half way"]]
    assert passed["seen"] == {"elicit": f"Go on with {topic}?", "sample": f"about {topic}"}
    assert passed["interactive"] == "elicited accept ok=True; sampled fine"
    assert passed["ran"] == [f"interactive {topic}"]


@UPSTREAMS
def test_a_changed_tool_list_is_read_again_and_drives_the_policy(run: Run, server: str) -> None:
    # Item 3: the annotations are refreshed on notifications/tools/list_changed.
    changed = run.report[f"{server}_changed"]
    user = f"gw-{server}-changed"
    assert changed["before"] == [{"text": f"shredded {user}-1", "is_error": False}]
    assert changed["armed"] == [{"text": "armed", "is_error": False}]
    [after] = changed["after"]
    assert after["is_error"] is True
    assert after["text"].startswith(DEMO_MESSAGE)
    assert changed["ran"] == [f"shred {user}-1"]


def test_an_ask_is_put_to_the_http_client_by_elicitation(run: Run) -> None:
    accepted = run.report["ask_accepted"]
    [asked] = accepted["asked"]
    assert ASK_MESSAGE in asked
    assert accepted["results"] == [{"text": "deployed gw-prod", "is_error": False}]
    assert accepted["ran"] == ["deploy gw-prod"]


def test_an_ask_goes_out_on_the_stream_of_its_call(run: Run) -> None:
    # A client with no GET stream open reads the ask where it reads the call's answer.
    asked = run.report["ask_on_the_call_stream"]
    assert asked["seen"] == ["elicitation/create", "result of 1"]
    assert asked["is_error"] is False
    assert asked["ran"] == ["deploy gw-raw"]


@UPSTREAMS
def test_only_an_answer_something_may_precede_is_an_event_stream(run: Run, server: str) -> None:
    # An event stream carries what may come before a call's result (an ask, progress);
    # any other call gets one JSON body, which costs the gateway far less.
    forms = run.report["answer_forms" if server == "demo" else "web_answer_forms"]
    assert {name: form["content_type"] for name, form in forms.items()} == {
        "asked": "text/event-stream",
        "not asked": "application/json",
        "not asked, progress": "text/event-stream",
    }
    for name, form in forms.items():
        assert form["text"] == f"contents of gw-forms-{name}"


@UPSTREAMS
def test_progress_reaches_a_client_that_cannot_be_asked(run: Run, server: str) -> None:
    steps = run.report["progress_unasked" if server == "demo" else "web_progress_unasked"]
    user = "gw-steps" if server == "demo" else "gw-web-steps"
    assert steps["text"] == f"stepped {user}-a"
    assert steps["progress"] == [[1.0, 2.0, "one of two"], [2.0, 2.0, "two of two"]]
    assert steps["ran"] == [f"steps {user}-a"]


def test_a_url_upstream_is_targeted_by_its_server_name(run: Run) -> None:
    web = run.report["web"]
    assert [r["is_error"] for r in web["results"]] == [False, False, True]
    assert web["results"][2]["text"].startswith(WEB_MESSAGE)
    assert web["ran"] == ["terminal echo W1", "terminal echo W2"]
    # demo's terminal rules did not count web's terminal
    assert run.usage("gw-web")["terminal-per-minute"]["used"] == 0


def test_an_unidentified_client_is_refused_at_connect(run: Run) -> None:
    refused = run.report["unidentified"]
    for case in ("none", "wrong", "header_only"):
        assert refused[case]["status"] == 401, case
        assert "unidentified client" in refused[case]["body"]["error"]["message"]
        assert refused[case]["www_authenticate"].startswith("Bearer")
    assert "unidentified client" in refused["sdk"]  # what an SDK client reports
    assert refused["unknown_server"]["status"] == 404
    assert "/demo/mcp" in refused["unknown_server"]["body"]["error"]["message"]
    assert refused["modern"]["status"] == 401  # the session-less protocol: no token, no way in
    assert "unidentified client" in refused["modern"]["body"]["error"]["message"]
    assert refused["modern_initialize"]["status"] == 400
    assert "_meta" in refused["modern_initialize"]["body"]["error"]["message"]
    assert "not-a-token" not in run.report["gateway_log"]  # no token is ever logged


def test_a_session_answers_only_its_own_user_and_server(run: Run) -> None:
    hijack = run.report["hijack"]
    assert hijack == {"bob": 404, "alice": 200, "other_server": 404}


def test_a_trusted_proxy_header_names_the_user(run: Run) -> None:
    assert run.report["by_header"]["results"] == [{"text": "ran echo H1", "is_error": False}]
    assert run.report["by_header"]["forwarded"] == 200  # X-Forwarded-For is not the peer
    assert run.usage("gw-carol")["terminal-per-minute"]["used"] == 1


@UPSTREAMS
def test_the_arguments_reach_an_args_rule(run: Run, server: str) -> None:
    # Item 3: the call's arguments go with the check, as the policy reads them.
    argued = run.report[f"{server}_args"]
    refused, listed, *padded = argued["results"]
    assert refused["is_error"] is True
    assert refused["text"].startswith(ARGS_MESSAGE)
    # Issue 25 item 1: padded past the wire's caps (70 KB, 500 strings of escapes), the
    # arguments are sent bounded and the rule still refuses.
    assert len(padded) == 2
    for result in padded:
        assert result["is_error"] is True
        assert result["text"].startswith(ARGS_MESSAGE)
    assert listed == {"text": f"ran ls /gw-{server}-args", "is_error": False}
    assert argued["ran"] == [f"terminal ls /gw-{server}-args"]


@UPSTREAMS
def test_a_call_running_when_its_session_is_deleted_is_settled(run: Run, server: str) -> None:
    deleted = scenario(run, "deleted", server)
    user = "gw-delete" if server == "demo" else "gw-web-delete"
    assert deleted["ran"] == [f"hang {user}-left started"]
    assert deleted["deleted"] == 200
    assert run.usage(user)["hang-one-at-a-time"]["used"] == 0


def test_a_client_that_vanishes_is_settled_at_the_idle_timeout(run: Run) -> None:
    assert run.report["dropped"]["ran"] == ["hang gw-drop-left started"]
    assert run.usage("gw-drop")["hang-one-at-a-time"]["used"] == 0


def test_sockets_that_never_finish_a_request_are_closed(run: Run) -> None:
    # The daemon's guard (http/connections.py) at RATEWARDEN_REQUEST_TIMEOUT_S=1.
    half_open = run.report["half_open"]
    assert half_open["healthy_meanwhile"] == 200
    assert half_open["closed"] == half_open["count"]
