"""The scaffold every host test shares: a host's environment, a daemon with a policy, a
driver run, and the daemon's answers read back.

A host test is a scenario: build (or reuse) the host's environment under .hosts/
(tests/helpers/hostenv.py), start a real `ratewarden serve` with the test's policy, run
the host (a driver script in the host's python, or a host CLI) against it and against an
address where nothing listens, then read what the daemon counted (/v1/usage, /v1/denials,
/metrics) and what the tools wrote. The pieces live here once; a test module keeps only
its policy, its driver and its assertions:

    @pytest.fixture(scope="module")
    def run(tmp_path_factory):
        with host_scenario("langchain", POLICY, tmp_path_factory.mktemp("langchain")) as host:
            yield host.run(DRIVER)

`host_scenario("<name>", ...)`, `host_python("<name>")`, `host_node_modules("<name>")` and
`host_cli("<name>")` name a host environment literally: tests/conftest.py reads those names
from the collected modules to start building the environments side by side.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.daemon import read_denials, read_usage
from tests.helpers.daemon import running_daemon as serving
from tests.helpers.fake_anthropic import FakeMcpModel, fake_mcp_model
from tests.helpers.hostenv import (
    TERMINAL_POLICY,
    Daemon,
    clean_environment,
    host_node_modules,
    host_python,
    run_driver,
    running_daemon,
)
from tests.helpers.redis_server import free_port

__all__ = [
    "APPROVAL", "DRIVERS", "TERMINAL_POLICY", "Daemon", "Run", "Scenario", "ShellCli",
    "appending", "bundled_claude", "clean_environment", "daemon_fixture", "hook_for", "host_cli",
    "host_node_modules", "host_python", "host_scenario", "lines", "new_user", "nowhere",
    "read_denials", "read_usage", "run_driver", "running_daemon", "serving", "settles",
    "started", "usage_of",
]  # fmt: skip

DRIVERS = Path(__file__).parent / "drivers"


def nowhere() -> str:
    """A daemon URL where nothing listens (a free port, left unbound)."""
    return f"http://127.0.0.1:{free_port()}"


def new_user(prefix: str = "user") -> str:
    """A user of the test's own, so tests can share one daemon."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def lines(path: Path) -> int:
    """How many lines a tool wrote to `path`: how many calls really ran."""
    return len(path.read_text().splitlines()) if path.exists() else 0


def appending(ran: Path) -> str:
    """A shell command that appends a line to `ran`: the tool call a fake model asks for."""
    return f"echo ran >> {shlex.quote(str(ran))}"


def hook_for(host: str, flags: str, stdin: str = "") -> str:
    """`ratewarden hook HOST FLAGS` from this checkout, as a host's command hook; `stdin`
    goes first (to feed the hook something else than its host's payload)."""
    return f"{stdin}{shlex.quote(sys.executable)} -m ratewarden hook {host} {flags}"


APPROVAL = "A human must approve this call before it can run"  # an `ask` no one can answer
GARBAGE = "cat > /dev/null; echo garbage | "  # a hook fed this instead of its host's JSON


@dataclass(frozen=True)
class ShellCli:
    """A coding agent's real CLI with `ratewarden hook HOST` as its shell hook, run for one
    shell call. `serve(ran)` is the fake model API (a context giving its URL and the model)
    whose model asks for one call that appends a line to `ran`; `run(url, hook)` runs the
    CLI against it with the hook command `hook`. The scenarios every such CLI passes alike
    are its methods."""

    host: str
    paused: str  # what failing closed tells the model
    serve: Callable[[Path], contextlib.AbstractContextManager[tuple[str, Any]]]
    run: Callable[[str, str], object]

    def once(self, ran: Path, hook: str) -> str:
        """The tool result the model got back for its one call."""
        with self.serve(ran) as (url, model):
            self.run(url, hook)
        result: str = model.tool_results[model.call_ids[0]]
        return result

    def refuses_an_ask(self, daemon: Daemon, ran: Path) -> None:
        """The CLI would run a call whose hook answered `ask` (intern-1 meets a 0/minute
        rule with `on_exceed: ask`): the hook denies it, saying a human must approve."""
        result = self.once(ran, hook_for(self.host, f"--url {daemon.url} --user intern-1"))
        assert lines(ran) == 0
        assert "Rate limit: max 0 terminal calls per minute" in result
        assert APPROVAL in result

    def follows_the_fail_mode_with_the_daemon_down(self, ran: Path) -> None:
        dead = nowhere()
        # Failing open (the default): the call runs.
        assert self.paused not in self.once(ran, hook_for(self.host, f"--url {dead}"))
        assert lines(ran) == 1
        # Failing closed: the model is told the guard is unavailable, and nothing runs.
        closed = self.once(ran, hook_for(self.host, f"--url {dead} --fail closed"))
        assert lines(ran) == 1
        assert self.paused in closed

    def follows_the_fail_mode_on_unreadable_input(self, ran: Path) -> None:
        """A broken installation (the hook fed garbage instead of its host's JSON): failing
        open, the hook exits 1 and the call runs; failing closed, exit 2 blocks it and the
        CLI hands the hook's stderr to the model."""
        dead = nowhere()
        self.once(ran, hook_for(self.host, f"--url {dead}", stdin=GARBAGE))
        assert lines(ran) == 1
        closed = self.once(ran, hook_for(self.host, f"--url {dead} --fail closed", stdin=GARBAGE))
        assert lines(ran) == 1
        assert f"Tool guard unavailable: cannot read the {self.host} hook input" in closed


def usage_of(daemon: Daemon, user: str, tool: str | None = None) -> dict[str, Any]:
    """`user`'s usage (of `tool`) as `daemon` counts it: what each rule has used."""
    return {rule: item["used"] for rule, item in read_usage(daemon.url, user, tool).items()}


def settles(daemon: Daemon) -> dict[str, float]:
    """The daemon's settle requests so far, by outcome (its /metrics; outcomes never seen
    left out)."""
    metrics = httpx.get(f"{daemon.url}/metrics", trust_env=False).text
    found = re.findall(r'^ratewarden_settles_total\{outcome="(\w+)"\} (\S+)$', metrics, re.M)
    return {outcome: float(count) for outcome, count in found if float(count)}


def host_cli(name: str) -> Path:
    """The executable `name` of the npm host `name` (node_modules/.bin), installed as needed."""
    cli = host_node_modules(name) / ".bin" / name
    assert cli.exists(), f"no {name} at {cli}"
    return cli


def wait_until_answering(url: str, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, f"{what} exited with {process.returncode}"
        with contextlib.suppress(httpx.HTTPError):
            httpx.get(url, timeout=1, trust_env=False)
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} did not answer at {url}")


@contextlib.contextmanager
def started(command: list[str], env: dict[str, str], ready: str, log: Path) -> Iterator[None]:
    """`command` running with `env` (its output in `log`) once `ready` answers, until the
    block ends: a host process the test talks to (an MCP server, a gateway)."""
    with log.open("wb") as sink:
        process = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
        try:
            wait_until_answering(ready, process, command[0])
            yield
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def bundled_claude(python: Path) -> Path:
    """The Claude Code CLI bundled in the claude-agent-sdk wheel of the host venv whose
    python is `python` (`host_python("claude_code")`): where the SDK itself looks for it."""
    found = subprocess.run(
        [
            str(python),
            "-c",
            "import claude_agent_sdk, pathlib; "
            "print(pathlib.Path(claude_agent_sdk.__file__).parent / '_bundled' / 'claude')",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return Path(found.stdout.strip())


def claude_with_mcp(
    config: dict[str, Any], model: FakeMcpModel, cwd: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    """`claude -p` (the bundled CLI) with MCP servers `config` only, its model `model`
    served locally, its home under `cwd`; it must end well."""
    claude = bundled_claude(host_python("claude_code"))
    home = cwd / "home"
    home.mkdir(exist_ok=True)
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "ANTHROPIC_API_KEY": "sk-ant-fake",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "ENABLE_TOOL_SEARCH": "false",  # MCP tools offered to the model up front, not deferred
    }
    with fake_mcp_model(model) as url:
        done = subprocess.run(
            [
                str(claude), "-p", "Use the tool.",
                "--output-format", "json",
                "--mcp-config", json.dumps(config), "--strict-mcp-config",
                "--allowedTools", model.tool,
            ],
            cwd=cwd, env={**env, "ANTHROPIC_BASE_URL": url},
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
    assert done.returncode == 0, f"claude failed:\n{done.stdout}\n{done.stderr}"
    return done


def daemon_fixture(policy: str, scope: str = "function", name: str = "daemon") -> Any:
    """A pytest fixture `name`: `ratewarden serve` with `policy` in the test's (or the
    module's) temporary directory, for as long as the fixture lives."""

    def daemon(request: pytest.FixtureRequest) -> Iterator[Daemon]:
        if scope == "function":
            directory: Path = request.getfixturevalue("tmp_path") / "daemon"
        else:
            factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
            directory = factory.mktemp("daemon")
        with running_daemon(policy, directory) as served:
            yield served

    return pytest.fixture(scope=scope, name=name)(daemon)  # type: ignore[call-overload]


class Run:
    """A driver's report, with the daemon it ran against still up to be asked."""

    def __init__(self, url: str, report: dict[str, Any]) -> None:
        self.url = url
        self.report = report

    def usage(self, user: str) -> dict[str, dict[str, Any]]:
        return read_usage(self.url, user)

    def denials(self, user: str) -> list[dict[str, Any]]:
        return read_denials(self.url, user)


@dataclass
class Scenario:
    """A host's python, a daemon with the test's policy, a work folder, and an address where
    nothing listens (for the fail-open and fail-closed scenarios)."""

    python: Path
    daemon: Daemon
    work: Path
    dead_url: str

    @property
    def url(self) -> str:
        return self.daemon.url

    def config(self, **extra: Any) -> dict[str, Any]:
        """A driver's usual config: the daemon, the dead address, the work folder."""
        return {"url": self.url, "dead_url": self.dead_url, "work": str(self.work), **extra}

    def run(self, driver: Path, config: dict[str, Any] | None = None, **options: Any) -> Run:
        """Run `driver` with the host's python (`config`, or the usual one); its report.
        `options` go to `run_driver` (timeout, env, stdin)."""
        config = self.config() if config is None else config
        return Run(self.url, run_driver(self.python, driver, config, **options))


@contextlib.contextmanager
def host_scenario(host: str, policy: str, work: Path, *flags: str) -> Iterator[Scenario]:
    """Host `host`'s environment (built as needed) and `ratewarden serve --policy <policy>
    <flags>` in `work`/daemon, until the block ends."""
    python = host_python(host)
    with running_daemon(policy, work / "daemon", *flags) as daemon:
        yield Scenario(python, daemon, work, nowhere())
