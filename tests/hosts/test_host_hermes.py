"""hermes-agent: ratewarden's plugin inside a real hermes-agent 0.19.0, offline.

The host proofs run `tests/hosts/drivers/hermes_loop.py` (the full `run_agent.AIAgent` loop
against a fake chat-completions server) and `tests/hosts/drivers/hermes_hooks.py` (hermes' own
hook dispatch) with the python of the hermes host venv (tests/helpers/hostenv.py), against a real
`ratewarden serve`. hermes finds the plugin by itself: through the pip entry point, or as
the directory plugin copied into $HERMES_HOME/plugins/ratewarden. Executions are counted
from what the terminal tool wrote, not from the hook. The unit tests at the end run in
this venv, where hermes is not installed: the module must import and work without it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from ratewarden.client import Guard
from ratewarden.integrations import hermes
from ratewarden.integrations.hermes import RatewardenPlugin, install_directory_plugin
from ratewarden.vocabulary import FailMode
from ratewarden.wire.bodies import CheckRequest, CheckResponse, SettleRequest, SettleResponse
from tests.hosts.scenario import (
    TERMINAL_POLICY,
    clean_environment,
    host_python,
    nowhere,
    running_daemon,
)

HOSTS = Path(__file__).parent / "drivers"
RATE_MESSAGE = "Rate limit: max 10 terminal calls per minute"
UNAVAILABLE = "Tool guard unavailable; terminal calls are paused"
CONFIG = """\
plugins:
  enabled: [{enabled}]
security:
  tirith_enabled: false
"""

# Matches only calls that carry the toolset tag: the thread test proves it is sent.
THREADS_POLICY = """\
version: 1
rules:
  - name: terminal-toolset-per-minute
    match: {tags: ["toolset:terminal"]}
    per: [user]
    rate: 50/minute
    label: terminal
"""

ASK_POLICY = """\
version: 1
rules:
  - name: terminal-needs-a-human
    match: {tool: terminal}
    per: [user]
    rate: 1/minute
    on_exceed: ask
"""


@pytest.fixture(scope="module")
def hermes_python() -> Path:
    return host_python("hermes")


def hermes_home(tmp_path: Path, *enabled: str) -> Path:
    home = tmp_path / "hermes-home"
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text(CONFIG.format(enabled=", ".join(enabled)))
    return home


def drive(
    python: Path, tmp_path: Path, argv: list[str], config: dict[str, Any], **env: str
) -> dict[str, Any]:
    """Run one driver with `config`; its report."""
    out = tmp_path / "report.json"
    config_file = tmp_path / "driver.json"
    config_file.write_text(json.dumps({**config, "out": str(out)}))
    environment = {k: v for k, v in clean_environment(**env).items() if not k.startswith("HERMES_")}
    environment.update({k: v for k, v in env.items() if k.startswith("HERMES_")})
    environment["HOME"] = str(tmp_path / "os-home")
    done = subprocess.run(
        [str(python), *argv, str(config_file)],
        capture_output=True,
        text=True,
        timeout=180,
        env=environment,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, f"driver failed:\n{done.stdout}\n{done.stderr}"
    report: dict[str, Any] = json.loads(out.read_text())
    assert "error" not in report, report["error"]
    return report


def get(url: str, path: str, **params: str) -> Any:
    with httpx.Client(trust_env=False) as http:
        response = http.get(f"{url}{path}", params=params).raise_for_status()
        return response.text if path == "/metrics" else response.json()


def used(url: str, user: str) -> dict[str, Any]:
    return {item["rule"]: item["used"] for item in get(url, "/v1/usage", user=user)["limits"]}


def settles(url: str) -> float:
    found = re.search(
        r'^ratewarden_settles_total\{outcome="settled"\} (\S+)$', get(url, "/metrics"), re.M
    )
    return float(found.group(1)) if found else 0.0


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def ratewarden_plugins(report: dict[str, Any]) -> list[tuple[str, str, bool, int]]:
    return [
        (p["name"], p["source"], p["enabled"], p["hooks"])
        for p in report["plugins"]
        if "ratewarden" in p["name"]
    ]


# -- the agent loop ---------------------------------------------------------------------


@pytest.mark.timeout(600)  # the first run builds the host venv
@pytest.mark.parametrize("source", ["entrypoint", "directory"])
def test_agent_loop_refuses_the_eleventh_terminal_call(
    hermes_python: Path, tmp_path: Path, source: str
) -> None:
    """AIAgent asks for terminal 11 times; ten run, the model reads our sentence."""
    home = hermes_home(tmp_path, "ratewarden")
    if source == "directory":
        assert install_directory_plugin(home) == home / "plugins" / "ratewarden"
    counter = tmp_path / "counter.txt"
    with running_daemon(TERMINAL_POLICY, tmp_path / "daemon") as daemon:
        report = drive(
            hermes_python,
            tmp_path,
            [str(HOSTS / "hermes_loop.py")],
            {"mode": source, "counter": str(counter), "tool_calls": 11},
            HERMES_HOME=str(home),
            RATEWARDEN_URL=daemon.url,
        )
        # Exactly one ratewarden plugin, from the source under test, with both hooks.
        expected = "entrypoint" if source == "entrypoint" else "user"
        assert ratewarden_plugins(report) == [("ratewarden", expected, True, 2)]
        assert report["pre_tool_call_hooks"] == 1

        # What the model received: the tool results of the last request, in order.
        assert report["asked"] == 11
        assert report["final_response"] == "Done counting."
        last = [r for r in report["requests"] if r.get("tools")][-1]
        results = [m["content"] for m in last["messages"] if m["role"] == "tool"]
        assert len(results) == 11
        for ran in results[:10]:
            assert json.loads(ran)["error"] is None
            assert json.loads(ran)["exit_code"] == 0
        assert RATE_MESSAGE in json.loads(results[10])["error"]

        # What happened: ten commands ran, ten counted for discord:1234, ten settled.
        assert lines(counter) == [f"call-{n}" for n in range(1, 11)]
        assert used(daemon.url, "discord:1234") == {"terminal-per-minute": 10}
        assert settles(daemon.url) == 10
        [denial] = get(daemon.url, "/v1/denials")["denials"]
        assert denial["user"] == "discord:1234"
        assert (denial["tool"], denial["rule"], denial["event"]) == (
            "terminal",
            "terminal-per-minute",
            "deny",
        )
        assert denial["call_id"].startswith("call_fake_11~")  # hermes' tool_call_id
        assert denial["session"]  # hermes' session id


# -- hermes' hook dispatch ----------------------------------------------------------------


@pytest.mark.timeout(600)
def test_fails_open_when_the_daemon_is_unreachable(hermes_python: Path, tmp_path: Path) -> None:
    counter = tmp_path / "counter.txt"
    report = drive(
        hermes_python,
        tmp_path,
        [str(HOSTS / "hermes_hooks.py"), "fail_mode"],
        {"counter": str(counter)},
        HERMES_HOME=str(hermes_home(tmp_path, "ratewarden")),
        RATEWARDEN_URL=nowhere(),
    )
    assert ratewarden_plugins(report) == [("ratewarden", "entrypoint", True, 2)]
    assert report["result"]["error"] is None  # the tool ran, unblocked
    assert report["shim_message"] is None
    assert lines(counter) == ["call-1"]


@pytest.mark.timeout(600)
def test_fails_closed_when_told_to(hermes_python: Path, tmp_path: Path) -> None:
    counter = tmp_path / "counter.txt"
    report = drive(
        hermes_python,
        tmp_path,
        [str(HOSTS / "hermes_hooks.py"), "fail_mode"],
        {"counter": str(counter)},
        HERMES_HOME=str(hermes_home(tmp_path, "ratewarden")),
        RATEWARDEN_URL=nowhere(),
        RATEWARDEN_FAIL="closed",
    )
    assert report["result"] == {"error": UNAVAILABLE}
    assert report["shim_message"] == UNAVAILABLE
    assert lines(counter) == []


@pytest.mark.timeout(600)
def test_sixteen_threads_get_exactly_fifty_calls(hermes_python: Path, tmp_path: Path) -> None:
    """80 pre_tool_call hooks from 16 threads at once against 50/minute; then settles."""
    with running_daemon(THREADS_POLICY, tmp_path / "daemon") as daemon:
        report = drive(
            hermes_python,
            tmp_path,
            [str(HOSTS / "hermes_hooks.py"), "threads"],
            {"counter": str(tmp_path / "counter.txt"), "threads": 16, "calls_per_thread": 5},
            HERMES_HOME=str(hermes_home(tmp_path, "ratewarden")),
            RATEWARDEN_URL=daemon.url,
        )
        assert report["alive"] == 0
        assert report["allowed"] == 50
        assert len(report["blocked"]) == 30
        assert all(m.startswith("Rate limit: max 50 terminal calls") for m in report["blocked"])
        assert report["in_flight_after"] == 0  # every allowed call settled and forgotten
        assert used(daemon.url, "slack:U42") == {"terminal-toolset-per-minute": 50}
        assert settles(daemon.url) == 50


@pytest.mark.timeout(600)
def test_ask_goes_to_hermes_approval_gate(hermes_python: Path, tmp_path: Path) -> None:
    """No human present: refused (fail-closed). A human who approves: counted, then run."""
    counter = tmp_path / "counter.txt"
    with running_daemon(ASK_POLICY, tmp_path / "daemon") as daemon:
        report = drive(
            hermes_python,
            tmp_path,
            [str(HOSTS / "hermes_hooks.py"), "ask"],
            {"counter": str(counter)},
            HERMES_HOME=str(hermes_home(tmp_path, "ratewarden")),
            RATEWARDEN_URL=daemon.url,
            RATEWARDEN_USER="ask-user",  # no gateway session: the default user
        )
        first, unattended, approved = report["results"]
        assert first["error"] is None
        assert "Rate limit: max 1 terminal calls per minute" in unattended["error"]
        assert "requires approval" in unattended["error"]  # hermes' gate said no
        assert approved["error"] is None
        [prompt] = report["prompts"]
        assert "Rate limit: max 1 terminal calls per minute" in prompt["description"]
        assert lines(counter) == ["call-1", "call-3"]
        denials = get(daemon.url, "/v1/denials")["denials"]
        events = [(d["event"], d["user"], d["call_id"].split("~")[0]) for d in denials]
        # call_2 and call_3 were asked; call_3 was then checked again as approved.
        assert sorted(events) == [
            ("approved", "ask-user", "call_3"),
            ("ask", "ask-user", "call_2"),
            ("ask", "ask-user", "call_3"),
        ]
        assert settles(daemon.url) == 2


@pytest.mark.timeout(600)
def test_one_plugin_counts_once_even_when_installed_twice(
    hermes_python: Path, tmp_path: Path
) -> None:
    """Entry point + directory copy `ratewarden` (hermes keeps one) + a renamed copy."""
    home = hermes_home(tmp_path, "ratewarden", "ratewarden-copy")
    install_directory_plugin(home)
    copy = home / "plugins" / "ratewarden-copy"
    shutil.copytree(home / "plugins" / "ratewarden", copy)
    manifest = copy / "plugin.yaml"
    manifest.write_text(manifest.read_text().replace("name: ratewarden", "name: ratewarden-copy"))
    with running_daemon(TERMINAL_POLICY, tmp_path / "daemon") as daemon:
        report = drive(
            hermes_python,
            tmp_path,
            [str(HOSTS / "hermes_hooks.py"), "duplicates"],
            {"counter": str(tmp_path / "counter.txt")},
            HERMES_HOME=str(home),
            RATEWARDEN_URL=daemon.url,
            RATEWARDEN_USER="dup-user",
        )
        assert sorted(ratewarden_plugins(report)) == [
            ("ratewarden", "entrypoint", True, 2),
            ("ratewarden-copy", "user", True, 0),  # loaded, but added no second hook
        ]
        assert report["hooks"] == 1
        assert report["result"]["error"] is None
        assert used(daemon.url, "dup-user") == {"terminal-per-minute": 1}


@pytest.mark.timeout(600)
def test_each_settle_carries_the_digest_of_the_result_the_model_got(
    hermes_python: Path, tmp_path: Path
) -> None:
    """Issue #29 item 2: a call the daemon answered with `send_result` is settled with the
    digest of post_tool_call's `result`, the text hermes hands the model."""
    from ratewarden.arguments import result_digest

    home = hermes_home(tmp_path, "ratewarden")
    with running_daemon(TERMINAL_POLICY, tmp_path / "daemon") as daemon:
        report = drive(
            hermes_python,
            tmp_path,
            [str(HOSTS / "hermes_hooks.py"), "digest"],
            {"counter": str(tmp_path / "counter.txt")},
            HERMES_HOME=str(home),
            RATEWARDEN_URL=daemon.url,
            RATEWARDEN_USER="digest-user",
        )
    first, second = report["results"]
    assert json.loads(first)["error"] is None  # the tool ran
    digests = [settle.get("result_digest") for settle in report["settles"]]
    assert digests == [result_digest(first), result_digest(second)]


# -- the adapter without hermes -----------------------------------------------------------


class FakeGuard(Guard):
    """Answers from a list; records checks and settles."""

    def __init__(self, *answers: CheckResponse) -> None:
        self.fail = FailMode.OPEN
        self.answers = list(answers)
        self.checks: list[CheckRequest] = []
        self.settled: list[tuple[str, SettleRequest | None]] = []
        self._guard_lock = threading.Lock()

    def check(self, request: CheckRequest) -> CheckResponse:
        with self._guard_lock:
            self.checks.append(request)
            return self.answers.pop(0).model_copy(update={"call_id": request.call_id or ""})

    def settle(self, call_id: str, request: SettleRequest | None = None) -> SettleResponse | None:
        self.settled.append((call_id, request))
        return None


def allow() -> CheckResponse:
    return CheckResponse(decision="allow", allowed=True, message="", call_id="")


def deny(message: str = RATE_MESSAGE) -> CheckResponse:
    return CheckResponse(decision="deny", allowed=False, message=message, call_id="")


def test_without_hermes_the_user_is_the_default_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RATEWARDEN_USER", "carol")
    guard = FakeGuard(allow())
    plugin = RatewardenPlugin(guard=guard)
    assert plugin.pre_tool_call(tool_name="terminal", session_id="s", tool_call_id="c1") is None
    [check] = guard.checks
    assert (check.user, check.tool, check.session, check.metadata) == (
        "carol",
        "terminal",
        "s",
        None,
    )
    assert check.call_id is not None
    assert check.call_id.startswith("c1~")


def test_deny_blocks_and_is_never_settled() -> None:
    guard = FakeGuard(deny())
    plugin = RatewardenPlugin(guard=guard, user=lambda hook: "discord:1")
    answer = plugin.pre_tool_call(tool_name="terminal", tool_call_id="c1", unknown_kwarg=1)
    assert answer == {"action": "block", "message": RATE_MESSAGE}
    plugin.post_tool_call(tool_name="terminal", tool_call_id="c1", status="blocked")
    assert guard.settled == []


def test_settles_with_status_and_duration_or_releases_when_blocked_elsewhere() -> None:
    guard = FakeGuard(allow(), allow())
    plugin = RatewardenPlugin(guard=guard, user=lambda hook: "u")
    assert plugin.pre_tool_call(tool_name="terminal", tool_call_id="a") is None
    assert plugin.pre_tool_call(tool_name="terminal", tool_call_id="b") is None
    plugin.post_tool_call(tool_name="terminal", tool_call_id="a", status="error", duration_ms=12)
    # Allowed by us, then blocked by another plugin: it never ran, so it costs nothing.
    plugin.post_tool_call(tool_name="terminal", tool_call_id="b", status="blocked", duration_ms=0)
    plugin.post_tool_call(tool_name="terminal", tool_call_id="b", status="ok")  # no second settle
    (a_id, a), (b_id, b) = guard.settled
    assert (a_id, b_id) == (guard.checks[0].call_id, guard.checks[1].call_id)
    assert a == SettleRequest(status="error", duration_ms=12.0)
    assert b == SettleRequest(status="blocked", duration_ms=0.0, cost=0.0)


def test_repeated_tool_call_ids_get_fresh_call_ids() -> None:
    """Some model servers send `call_0` every time, even twice in one batch."""
    guard = FakeGuard(allow(), allow(), allow())
    plugin = RatewardenPlugin(guard=guard, user=lambda hook: "u")
    plugin.pre_tool_call(tool_name="terminal", tool_call_id="call_0")
    plugin.post_tool_call(tool_name="terminal", tool_call_id="call_0", status="ok")
    plugin.pre_tool_call(tool_name="terminal", tool_call_id="call_0")
    plugin.pre_tool_call(tool_name="terminal", tool_call_id="call_0")
    plugin.post_tool_call(tool_name="terminal", tool_call_id="call_0", status="ok")
    plugin.post_tool_call(tool_name="terminal", tool_call_id="call_0", status="ok")
    call_ids = [check.call_id for check in guard.checks]
    assert len(set(call_ids)) == 3
    assert [call_id for call_id, _ in guard.settled] == call_ids
    assert not plugin._in_flight


def test_an_internal_error_follows_the_fail_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(hermes, "session_user", broken)
    for fail, expected in [("open", None), ("closed", {"action": "block", "message": UNAVAILABLE})]:
        plugin = RatewardenPlugin(guard=Guard(nowhere(), fail=fail))
        assert plugin.pre_tool_call(tool_name="terminal") == expected


def test_an_unreachable_daemon_follows_the_fail_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RATEWARDEN_URL", nowhere())
    monkeypatch.setenv("RATEWARDEN_FAIL", "closed")
    plugin = RatewardenPlugin()
    assert plugin.guard.fail == "closed"
    assert plugin.pre_tool_call(tool_name="terminal") == {"action": "block", "message": UNAVAILABLE}
    monkeypatch.setenv("RATEWARDEN_FAIL", "open")
    open_plugin = RatewardenPlugin()
    assert open_plugin.pre_tool_call(tool_name="terminal", tool_call_id="x") is None
    assert not open_plugin._in_flight  # a degraded allow has no record to settle
    open_plugin.post_tool_call(tool_name="terminal", tool_call_id="x", status="ok")
    assert open_plugin.guard.unreachable == 1  # degraded allows are not settled


@pytest.mark.parametrize(
    ("value", "expected"),
    [("", "open"), ("open", "open"), (" Closed ", "closed"), ("shut", "closed")],
)
def test_fail_mode_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: str
) -> None:
    monkeypatch.setenv("RATEWARDEN_FAIL", value)
    assert hermes.fail_from_environment() == expected


def test_register_adds_both_hooks_once_per_manager() -> None:
    manager = SimpleNamespace(_hooks={})

    class Context:
        _manager = manager

        def register_hook(self, name: str, callback: Any) -> None:
            manager._hooks.setdefault(name, []).append(callback)

    guard = FakeGuard()
    RatewardenPlugin(guard=guard).register(Context())
    RatewardenPlugin(guard=guard).register(Context())  # a second copy of the plugin
    assert sorted(manager._hooks) == ["post_tool_call", "pre_tool_call"]
    assert [len(hooks) for hooks in manager._hooks.values()] == [1, 1]
    manager._hooks.clear()  # hermes' forced rediscovery: registering again is right
    RatewardenPlugin(guard=guard).register(Context())
    assert len(manager._hooks["pre_tool_call"]) == 1


def test_the_directory_plugin_installs_and_delegates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "home"))
    target = install_directory_plugin()
    assert target == tmp_path / "home" / "plugins" / "ratewarden"
    assert sorted(p.name for p in target.iterdir()) == ["__init__.py", "plugin.yaml"]
    assert "name: ratewarden\n" in (target / "plugin.yaml").read_text()
    assert "kind: standalone\n" in (target / "plugin.yaml").read_text()
