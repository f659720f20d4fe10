"""IBM ContextForge: the real gateway, offline, with RatewardenPlugin, in front of MCP servers.

The gateway (mcp-contextforge-gateway, its own venv: it pins mcp 1.x) runs as its own
uvicorn process on 127.0.0.1 with a sqlite database in a temp dir, JWT auth, plugins on
and every exporter off. Three small MCP SDK servers (streamable HTTP,
drivers/contextforge_server.py) are registered with it as `live`, `closed` and `open`; the
plugin is configured three times, each for one server's tools by a plugin condition:
`live` against a real `ratewarden serve`, `closed` and `open` against a port where nothing
listens, failing closed and open. The MCP SDK's client (drivers/contextforge_client.py)
calls the tools through the gateway's `/mcp` endpoint with a JWT the gateway's own tool
issued for admin@example.com.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.redis_server import free_port
from tests.hosts.scenario import (
    DRIVERS,
    TERMINAL_POLICY,
    clean_environment,
    host_scenario,
    read_usage,
    run_driver,
)

SERVER = DRIVERS / "contextforge_server.py"
CLIENT = DRIVERS / "contextforge_client.py"
USER = "admin@example.com"  # the JWT's email: the gateway's authenticated identity
OTHER_USER = "bob@example.com"
RATE_MESSAGE = "Rate limit: max 10 terminal calls per minute"
UNAVAILABLE = "Tool guard unavailable; terminal calls are paused"
BLOCKED = "tool_pre_invoke blocked by plugin {plugin}: RATEWARDEN - "
START_TIMEOUT_S = 120  # the gateway migrates its fresh sqlite database at start

POLICY = (
    TERMINAL_POLICY
    + """\
  - name: terminal-one-at-a-time
    match: {tool: terminal}
    concurrency: 1
  - name: broken-one-at-a-time
    match: {tool: broken}
    concurrency: 1
  - name: read-only-quota
    match: {read_only: true}
    per: [user, tool]
    rate: 1/minute
  - name: wipe-needs-a-human
    match: {tool: wipe, destructive: true}
    rate: 0/minute
    on_exceed: ask
"""
)

PLUGINS = """\
plugins:
  - name: ratewarden
    kind: ratewarden.integrations.contextforge.RatewardenPlugin
    hooks: ["tool_pre_invoke", "tool_post_invoke"]
    mode: sequential
    priority: 1000
    conditions:
      - tools: [live-terminal, live-broken, live-wipe, live-look]
    config: {{url: "{url}"}}
  - name: ratewarden-closed
    kind: ratewarden.integrations.contextforge.RatewardenPlugin
    hooks: ["tool_pre_invoke", "tool_post_invoke"]
    mode: sequential
    priority: 1000
    conditions:
      - tools: [closed-terminal]
    config: {{url: "{dead}", fail: closed}}
  - name: ratewarden-open
    kind: ratewarden.integrations.contextforge.RatewardenPlugin
    hooks: ["tool_pre_invoke", "tool_post_invoke"]
    mode: sequential
    priority: 1000
    conditions:
      - tools: [open-terminal]
    config: {{url: "{dead}", fail: open}}
plugin_dirs: []
plugin_settings:
  plugin_timeout: 30
  fail_on_plugin_error: false
"""

SERVERS = ("live", "closed", "open")


def gateway_environment(work: Path) -> dict[str, str]:
    """Offline and local: sqlite, memory cache, no UI, no telemetry, our plugin config."""
    return clean_environment(
        JWT_SECRET_KEY="ratewarden-test-jwt-secret-0123456789abcdef0123",
        AUTH_ENCRYPTION_SECRET="ratewarden-test-encryption-0123456789abcdef",
        BASIC_AUTH_PASSWORD="Rw-Test-Basic-9182!",
        PLATFORM_ADMIN_EMAIL=USER,
        PLATFORM_ADMIN_PASSWORD="Rw-Test-Admin-9182!",
        DATABASE_URL=f"sqlite:///{work / 'gateway.db'}",
        CACHE_TYPE="memory",
        REDIS_URL="",
        MCPGATEWAY_UI_ENABLED="false",
        MCPGATEWAY_ADMIN_API_ENABLED="false",
        OTEL_ENABLE_OBSERVABILITY="false",
        OBSERVABILITY_ENABLED="false",
        CPEX_CONTROL_TELEMETRY_ENABLED="false",
        SIEM_EXPORT_ENABLED="false",
        WEBHOOK_LOGGING_ENABLED="false",
        LLMCHAT_ENABLED="false",
        SSRF_ALLOW_LOCALHOST="true",  # the MCP servers are on 127.0.0.1
        SSRF_ALLOW_PRIVATE_NETWORKS="true",
        PLUGINS_ENABLED="true",
        PLUGINS_CONFIG_FILE=str(work / "plugins.yaml"),
        HEALTH_CHECK_INTERVAL="3600",
        ENVIRONMENT="development",
        LOG_LEVEL="INFO",
    )


@contextmanager
def process(command: list[str], cwd: Path, env: dict[str, str], name: str) -> Iterator[Path]:
    """`command` running in `cwd` (its output in <name>.log) until the block ends."""
    log = cwd / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_until_up(url: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            with httpx.Client(trust_env=False, timeout=2) as http:
                if http.get(url).status_code < 500:
                    return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{url} never answered:\n{log.read_text()[-3000:]}")


class Gateway:
    def __init__(self, python: Path, work: Path, url: str, daemon_url: str, token: str) -> None:
        self.python, self.work, self.url, self.daemon_url, self.token = (
            python,
            work,
            url,
            daemon_url,
            token,
        )
        self.other_token = ""  # a second user's JWT

    def call(self, *calls: tuple[str, dict[str, Any]], token: str | None = None) -> dict[str, Any]:
        """The MCP client's calls through the gateway, in one session; its report."""
        config = {
            "url": f"{self.url}/mcp",
            "token": token or self.token,
            "calls": [list(c) for c in calls],
        }
        report: dict[str, Any] = run_driver(self.python, CLIENT, config)
        return report

    def ran(self, server: str) -> list[str]:
        """What the server's tools wrote: one line a run."""
        path = self.work / f"{server}-ran.txt"
        return path.read_text().splitlines() if path.exists() else []

    def usage(self, user: str) -> dict[str, dict[str, Any]]:
        return read_usage(self.daemon_url, user)


def issue_token(python: Path, env: dict[str, str], work: Path, user: str = USER) -> str:
    """A JWT for `user`, made by the gateway's own tool with its secret."""
    done = subprocess.run(
        [str(python), "-m", "mcpgateway.utils.create_jwt_token", "-u", user, "--admin", "-e", "60"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1]


def register(url: str, token: str, name: str, server_url: str) -> None:
    body = {"name": name, "url": server_url, "transport": "STREAMABLEHTTP"}
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(trust_env=False, timeout=60) as http:
        answer = http.post(f"{url}/gateways", json=body, headers=headers)
    assert answer.status_code in (200, 201), answer.text


def add_user(url: str, token: str, email: str) -> None:
    """A second account in the gateway (an admin: it sees every tool without teams)."""
    body = {"email": email, "password": "Rw-Second-Account-Pass-9182!", "is_admin": True}
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(trust_env=False, timeout=60) as http:
        answer = http.post(f"{url}/auth/email/admin/users", json=body, headers=headers)
    assert answer.status_code in (200, 201), answer.text


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    work = tmp_path_factory.mktemp("contextforge")
    with ExitStack() as stack:
        host = stack.enter_context(host_scenario("contextforge", POLICY, work))
        python, daemon, dead = host.python, host.daemon, host.dead_url
        (work / "plugins.yaml").write_text(PLUGINS.format(url=daemon.url, dead=dead))
        server_urls = {}
        for name in SERVERS:
            port = free_port()
            command = [str(python), str(SERVER), str(port), str(work / f"{name}-ran.txt")]
            log = stack.enter_context(process(command, work, clean_environment(), name))
            server_urls[name] = f"http://127.0.0.1:{port}/mcp"
            wait_until_up(server_urls[name], log)
        env = gateway_environment(work)
        port = free_port()
        command = [str(python), "-m", "uvicorn", "mcpgateway.main:app"]
        command += ["--host", "127.0.0.1", "--port", str(port)]
        log = stack.enter_context(process(command, work, env, "gateway"))
        url = f"http://127.0.0.1:{port}"
        wait_until_up(f"{url}/health", log)
        token = issue_token(python, env, work)
        for name, server_url in server_urls.items():
            register(url, token, name, server_url)
        found = Gateway(python, work, url, daemon.url, token)
        add_user(url, token, OTHER_USER)
        found.other_token = issue_token(python, env, work, OTHER_USER)
        yield found


pytestmark = pytest.mark.timeout(900)  # the first run builds the gateway's venv


def terminal(i: int, server: str = "terminal") -> tuple[str, dict[str, Any]]:
    return (server, {"command": f"echo {i}"})


def test_eleventh_call_is_blocked_with_ratewarden_message(gateway: Gateway) -> None:
    report = gateway.call(*(terminal(i, "live-terminal") for i in range(1, 12)))
    results = report["results"]
    assert len(results) == 11
    assert [r["text"] for r in results[:10]] == [f"ran echo {i}" for i in range(1, 11)]
    assert not any(r["is_error"] for r in results[:10])
    eleventh = results[10]
    # Exactly what the MCP client received: a tool result, isError, with our sentence.
    assert eleventh["is_error"] is True
    assert eleventh["text"].startswith(BLOCKED.format(plugin="ratewarden") + RATE_MESSAGE)
    assert eleventh["text"].endswith("(ratewarden policy)")
    assert gateway.ran("live") == [f"terminal echo {i}" for i in range(1, 11)]
    usage = gateway.usage(USER)  # the JWT's email, not a default user
    assert usage["terminal-per-minute"]["used"] == 10
    # Ten sequential calls under a cap of one at a time: each was settled after it ran.
    assert usage["terminal-one-at-a-time"]["used"] == 0


def test_each_authenticated_user_has_a_counter_of_their_own(gateway: Gateway) -> None:
    """After admin's ten, bob (another JWT) still gets his: the user is the JWT's email."""
    report = gateway.call(terminal(1, "live-terminal"), token=gateway.other_token)
    assert report["results"][0]["text"] == "ran echo 1"
    assert gateway.usage(OTHER_USER)["terminal-per-minute"]["used"] == 1


def test_a_failed_tool_is_settled(gateway: Gateway) -> None:
    report = gateway.call(("live-broken", {"command": "a"}), ("live-broken", {"command": "b"}))
    first, second = report["results"]
    assert first["is_error"]
    assert "the command failed" in first["text"]
    assert second["is_error"]  # the tool ran again: the first call's slot was freed
    assert "the command failed" in second["text"]
    assert [line for line in gateway.ran("live") if line.startswith("broken")] == [
        "broken a",
        "broken b",
    ]
    assert gateway.usage(USER)["broken-one-at-a-time"]["used"] == 0


def test_annotations_reach_the_daemon(gateway: Gateway) -> None:
    report = gateway.call(
        ("live-look", {"path": "/a"}), ("live-look", {"path": "/b"}), ("live-wipe", {"path": "/"})
    )
    assert report["tools"]["live-look"] == {"readOnlyHint": True}
    look, look_again, wipe = report["results"]
    assert look == {"tool": "live-look", "is_error": False, "text": "looked at /a"}
    # read_only arrived: the per-tool quota of read-only tools counted it
    assert look_again["is_error"]
    assert "Rate limit: max 1 look calls per minute" in look_again["text"]
    # ask: refused, the sentence saying a human must approve
    assert wipe["is_error"]
    assert "Rate limit: max 0 wipe calls per minute" in wipe["text"]
    assert "A human must approve this call" in wipe["text"]
    ran = gateway.ran("live")
    assert "look /a" in ran
    assert "look /b" not in ran
    assert "wipe /" not in ran


def test_fail_closed_with_a_dead_daemon_refuses(gateway: Gateway) -> None:
    report = gateway.call(terminal(1, "closed-terminal"))
    (result,) = report["results"]
    assert result["is_error"]
    assert result["text"].startswith(BLOCKED.format(plugin="ratewarden-closed") + UNAVAILABLE)
    assert gateway.ran("closed") == []


def test_fail_open_with_a_dead_daemon_runs(gateway: Gateway) -> None:
    report = gateway.call(terminal(1, "open-terminal"), terminal(2, "open-terminal"))
    assert [r["text"] for r in report["results"]] == ["ran echo 1", "ran echo 2"]
    assert gateway.ran("open") == ["terminal echo 1", "terminal echo 2"]


def test_the_module_imports_without_the_gateway() -> None:
    """Without cpex (blocked here, whatever is installed): the module imports, inert."""
    code = (
        "import sys; sys.modules['cpex'] = None; sys.modules['mcpgateway'] = None\n"
        "from ratewarden.integrations import contextforge\n"
        "assert contextforge.Plugin is object\n"
        "print(contextforge.RatewardenPlugin.__name__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "RatewardenPlugin"
