"""What one user can take of `ratewarden mcp --listen` (issue 25, items 7 and 8): the
gateway's sessions, the server processes behind them, and its event loop.

A gateway fronting the test server as a command (`drivers/mcp_server.py`, which writes a
line per process started), in front of a real daemon on its own Redis, driven by raw HTTP
and the official SDK's client (`drivers/mcp_gateway_sessions.py`, in the mcp venv): the
tests count processes and read statuses, never time anything.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ratewarden.wire.bodies import MAX_ARGS_DEPTH
from ratewarden.wire.bounded import MAX_ITEMS
from tests.helpers.redis_server import free_port, running_redis
from tests.hosts.scenario import clean_environment, host_python, run_driver, running_daemon, started

DRIVER = Path(__file__).parent / "drivers" / "mcp_gateway_sessions.py"
USERS = [
    "gw-warm",
    "gw-lazy",
    "gw-hog",
    "gw-bob",
    "gw-carol",
    "gw-race-a",
    "gw-race-b",
    "gw-bodies",
]
MAX_USER_SESSIONS = 3
MAX_SESSIONS = 2 * MAX_USER_SESSIONS  # two users at their caps fill the gateway
# Every call is checked; none is limited (a user's calls in flight at once included).
POLICY = """\
version: 1
rules:
  - name: no-root-delete
    match: {tool: demo.terminal, args: {command: {contains: "rm -rf /"}}}
    deny: "Refusing destructive root delete"
"""

pytestmark = pytest.mark.timeout(900)  # the first run builds the host venv


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    work = tmp_path_factory.mktemp("mcp-gateway-limits")
    with (
        running_redis(work) as redis,
        running_daemon(POLICY, work / "daemon", "--store-url", redis.url) as served,
    ):
        yield served.url


@contextlib.contextmanager
def gateway(daemon: str, work: Path, *flags: str) -> Iterator[dict[str, Any]]:
    """A gateway fronting the test server as `demo`, and as `flaky` while a flag file is
    there: the driver's config."""
    python = host_python("mcp")
    tokens = {user: f"token-for-{user}-0123456789" for user in USERS}
    (work / "tokens.yaml").write_text(yaml.safe_dump(tokens))
    env = {
        **clean_environment(),
        "MCP_RAN": str(work / "demo.ran"),
        "MCP_STARTED": str(work / "demo.started"),
    }
    port = free_port()
    server = f"{python} {Path(__file__).parent / 'drivers' / 'mcp_server.py'}"
    flag = work / "flaky.flag"
    flag.touch()
    command = [
        str(python.parent / "ratewarden"), "mcp", "--listen", f"127.0.0.1:{port}",
        "--server", f"demo={server}", "--server", f"flaky=sh -c 'test -f {flag} && exec {server}'",
        "--tokens", str(work / "tokens.yaml"), "--url", daemon, *flags,
    ]  # fmt: skip
    with started(command, env, f"http://127.0.0.1:{port}/healthz", work / "gateway.log"):
        yield {
            "gateway": f"http://127.0.0.1:{port}", "tokens": tokens, "work": str(work),
            "flag": str(flag),
        }  # fmt: skip


def drive(python: Path, config: dict[str, Any], scenario: str) -> dict[str, Any]:
    return run_driver(python, DRIVER, {**config, "scenario": scenario}, timeout=300)


def test_opening_sessions_starts_no_server_until_a_request_needs_it(
    daemon: str, tmp_path: Path
) -> None:
    with gateway(daemon, tmp_path) as config:
        report = drive(host_python("mcp"), config, "lazy")
    assert report["before"] == 0
    assert report["after_warm"] == 1  # the first session's initialize: only the server knows
    assert report["opened"] == [200] * 3
    assert report["pinged"] == [200] * 3  # answered by the gateway
    assert report["after_open"] == 1  # three sessions opened and pinged: no process
    assert report["first_call"] == "ran echo lazy-1"
    assert report["after_call"] == 2  # the call's session started its own
    assert report["pinged_after"] == 200
    # An SDK client sees the server's own greeting, its tools, and its call run.
    assert report["sdk_server"] == "ratewarden-test-server"
    assert report["sdk_tools"] > 5
    assert report["sdk_call"] == ["ran echo lazy-2"]
    assert report["ran"] == ["terminal echo lazy-1", "terminal echo lazy-2"]
    # A server that cannot start when a session first needs it: that request and the
    # session's later ones are answered with an error, and the gateway goes on.
    unstartable = report["unstartable"]
    assert unstartable["opened"] == 200
    assert unstartable["call"] == "error MCP server 'flaky' is unavailable: EndOfStream"
    assert unstartable["again"] == "MCP server 'flaky' is unavailable: EndOfStream"
    assert unstartable["pinged"] == 200


def test_one_user_cannot_take_every_session(daemon: str, tmp_path: Path) -> None:
    flags = ["--max-user-sessions", str(MAX_USER_SESSIONS), "--max-sessions", str(MAX_SESSIONS)]
    with gateway(daemon, tmp_path, *flags) as config:
        report = drive(
            host_python("mcp"), {**config, "max_user_sessions": MAX_USER_SESSIONS}, "caps"
        )
    opened = MAX_USER_SESSIONS + 5
    # Each open past the cap closed the user's idle session unused longest.
    assert report["hog_opened"] == [200] * opened
    assert report["hog_alive"] == [404] * 5 + [200] * MAX_USER_SESSIONS
    # None of them used: one server process, the first session's (whose initialize only
    # the server could answer), and none since.
    assert report["started_idle"] == 1
    # Meanwhile another user connects, and their call runs.
    assert report["bob_opened"] == 200
    assert report["bob_call"] == "ran echo caps-bob"
    # With a call in flight in each of their sessions, the user gets no more; the calls
    # are not cut, and others still connect.
    assert report["hog_busy_open"] == 429
    assert report["busy_alive"] == [200] * MAX_USER_SESSIONS
    assert report["carol_opened"] == 200
    # Two users opening at once: each gets in, neither holds more than their cap (how many
    # each holds depends on the order the opens arrive in).
    assert set(report["race_alive"]) == {"gw-race-a", "gw-race-b"}
    assert all(1 <= held <= MAX_USER_SESSIONS for held in report["race_alive"].values())


def test_a_body_over_the_wires_caps_is_refused_unread(daemon: str, tmp_path: Path) -> None:
    with gateway(daemon, tmp_path) as config:
        report = drive(host_python("mcp"), config, "bodies")
    items, answers = report["items"], report["answers"]
    assert items["at the item cap"] == MAX_ITEMS
    assert items["one item over"] == MAX_ITEMS + 1
    too_many = f"a message of more than {MAX_ITEMS} items"
    too_deep = f"a message nested more than {MAX_ARGS_DEPTH + 2} levels deep"
    for name in ("500 000 items", "one item over"):
        assert answers[name]["status"] == 413, name
        assert too_many in answers[name]["text"], name
    assert answers["2 MB of 500 000 items"]["status"] == 413  # --max-body-bytes, 1 MiB
    assert answers["one level over"]["status"] == 413
    assert too_deep in answers["one level over"]["text"]
    for name, command in [
        ("at the item cap", "echo body-cap"),
        ("at the depth cap", "echo body-deep-cap"),
        ("deep as a string", "echo body-deep-string"),
        ("escapes", "echo body-escapes"),
    ]:
        assert answers[name] == {"status": 200, "text": f"ran {command}"}, name
    assert report["initialize"] == {"status": 413, "session": False}
    assert report["after"] == "ran echo body-after"  # the session goes on
    assert sorted(report["ran"]) == sorted(
        f"terminal echo body-{name}"
        for name in ("cap", "deep-cap", "deep-string", "escapes", "after")
    )
