"""The real Claude Code CLI (bundled in claude-agent-sdk) with the gateway as an `http` MCP
server, its bearer token in the config's `headers`.

Claude Code 2.x speaks the session-less 2026-07-28 protocol over HTTP: `server/discover`,
then `subscriptions/listen`, the lists, and each `tools/call` as a POST of its own, with no
`initialize` and no session id. The gateway fronts `demo` (tests/hosts/drivers/mcp_server.py
started as a command) and `web` (the same server listening on streamable HTTP, reached
with the gateway's own client). Offline: the model is the scripted Messages API of
tests/helpers/fake_anthropic.py, asking for the MCP tool again and again; the tool appends
a line to a file for each run, so the test counts what really ran.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.helpers.fake_anthropic import FakeMcpModel
from tests.helpers.redis_server import free_port
from tests.hosts.scenario import (
    DRIVERS,
    Daemon,
    claude_with_mcp,
    clean_environment,
    host_python,
    read_usage,
    running_daemon,
    started,
)

pytestmark = pytest.mark.timeout(900)  # the first run builds the host venvs

RATE_MESSAGE = "Rate limit: max 10 terminal calls per minute"
ASK_MESSAGE = "deploy needs a human's approval"
APPROVAL_NEEDED = "A human must approve this call before it can run"
TOKENS = {"cc-demo": "token-cc-demo-0123456789", "cc-web": "token-cc-web-0123456789",
          "cc-asker": "token-cc-asker-0123456789"}  # fmt: skip
POLICY = f"""\
version: 1
tools:
  demo.terminal: {{label: terminal}}
  web.terminal: {{label: terminal}}
rules:
  - name: terminal-per-minute
    match: {{tool: [demo.terminal, web.terminal]}}
    per: [user]
    rate: 10/minute
  - name: terminal-one-at-a-time    # ten calls in a row pass only if each was settled
    match: {{tool: [demo.terminal, web.terminal]}}
    per: [user]
    concurrency: 1
  - name: deploy-needs-approval
    match: {{tool: demo.deploy}}
    ask: "{ASK_MESSAGE}"
"""


@dataclass
class Gateway:
    url: str
    daemon: Daemon
    work: Path
    log: Path


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    python = host_python("mcp")
    host_python("claude_code")  # built alongside (conftest reads the names)
    work = tmp_path_factory.mktemp("mcp-gateway-claude")
    (work / "tokens.yaml").write_text(yaml.safe_dump(TOKENS))
    env = {**clean_environment(), "MCP_RAN": str(work / "ran.txt")}
    server = [str(python), str(DRIVERS / "mcp_server.py")]
    web_port, gateway_port = free_port(), free_port()
    with contextlib.ExitStack() as stack:
        daemon = stack.enter_context(running_daemon(POLICY, work / "daemon"))
        stack.enter_context(
            started(
                [*server, "--http", str(web_port)],
                {**env, "MCP_RAN": str(work / "web-ran.txt")},
                f"http://127.0.0.1:{web_port}/mcp",
                work / "web.log",
            )
        )
        stack.enter_context(
            started(
                [str(python.parent / "ratewarden"), "mcp", "--listen", f"127.0.0.1:{gateway_port}",
                 "--server", f"demo={' '.join(server)}",
                 "--server", f"web=http://127.0.0.1:{web_port}/mcp",
                 "--tokens", str(work / "tokens.yaml"), "--url", daemon.url],
                env,
                f"http://127.0.0.1:{gateway_port}/healthz",
                work / "gateway.log",
            )
        )  # fmt: skip
        yield Gateway(f"http://127.0.0.1:{gateway_port}", daemon, work, work / "gateway.log")


def run_claude(
    gateway: Gateway, tmp_path: Path, server: str, user: str, model: FakeMcpModel
) -> None:
    """`claude -p` with the gateway's `server` as its `http` MCP server `guarded`."""
    config = {
        "mcpServers": {
            "guarded": {
                "type": "http",
                "url": f"{gateway.url}/{server}/mcp",
                "headers": {"Authorization": f"Bearer {TOKENS[user]}"},
            }
        }
    }
    claude_with_mcp(config, model, tmp_path, timeout=240)


def ran(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("server", ["demo", "web"])
def test_real_claude_code_over_http_gets_the_message_as_the_11th_result(
    gateway: Gateway, tmp_path: Path, server: str
) -> None:
    user = f"cc-{server}"
    model = FakeMcpModel("mcp__guarded__terminal", {"command": f"echo {server}"}, calls=11)
    run_claude(gateway, tmp_path, server, user, model)
    assert len(model.tool_use_ids) == 11
    results = [model.tool_results.get(call, "") for call in model.tool_use_ids]
    # Claude Code hands the model the structured result: `{"result":"ran echo demo"}`.
    assert all(f"ran echo {server}" in text for text in results[:10]), results
    assert all(RATE_MESSAGE not in text for text in results[:10])
    assert RATE_MESSAGE in results[10], results[10]
    tool_log = gateway.work / ("ran.txt" if server == "demo" else "web-ran.txt")
    assert ran(tool_log).count(f"terminal echo {server}") == 10
    usage = read_usage(gateway.daemon.url, user)
    assert usage["terminal-per-minute"]["used"] == 10  # the token's user, on every request
    assert usage["terminal-one-at-a-time"]["used"] == 0  # each call settled
    assert TOKENS[user] not in gateway.log.read_text(errors="replace")


def test_real_claude_code_over_http_is_told_a_person_must_approve(
    gateway: Gateway, tmp_path: Path
) -> None:
    """Nobody can be asked on the session-less protocol: an ask is refused, saying so."""
    model = FakeMcpModel("mcp__guarded__deploy", {"target": "prod"}, calls=1)
    run_claude(gateway, tmp_path, "demo", "cc-asker", model)
    [result] = model.tool_results.values()
    assert ASK_MESSAGE in result
    assert APPROVAL_NEEDED in result
    assert "deploy prod" not in ran(gateway.work / "ran.txt")
