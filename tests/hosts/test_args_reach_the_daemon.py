"""A tool call's arguments reach the daemon from every adapter and hook, exactly when the
policy in force reads them (issue 17, item 5).

Each host runs for real, offline, as in its own host test (tests/hosts/test_host_*.py),
against a real `ratewarden serve` whose audit includes arguments (RATEWARDEN_AUDIT_ARGS):

- under a policy that reads them (`match: {args: {command: {prefix: "rm "}}}` with
  `deny:`), an `rm` command is refused with the rule's text and never runs, while an
  `echo` runs: only the argument tells them apart, so it arrived. The audit entry of the
  refusal holds the arguments the host gave;
- under a policy that does not read them (`deny:` on the tool alone), the refusal's audit
  entry holds no `args`: the daemon would have written them had they been sent.

Then the end-to-end proof through hermes' full `AIAgent` loop: a demo-mode policy refuses
`terminal` with its text, and under `per: [session, tool, args]` the fourth identical
command is told "Repeated call: ..." while a different one still runs.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.fake_anthropic import fake_messages_api
from tests.hosts.scenario import (
    DRIVERS,
    Daemon,
    bundled_claude,
    clean_environment,
    host_python,
    new_user,
    read_denials,
    run_driver,
    running_daemon,
)

pytestmark = pytest.mark.timeout(900)  # the first run builds the host venvs

RATEWARDEN = Path(sys.executable).with_name("ratewarden")  # this venv's console script
FRAMEWORKS = ("openai_agents", "pydantic_ai", "strands")  # pins: tests/hosts/requirements/

RM_REFUSED = "Refusing rm commands"
READS_ARGS = f"""\
version: 1
rules:
  - name: no-rm
    match:
      tool: [terminal, Bash]
      args: {{command: {{prefix: "rm "}}}}
    deny: "{RM_REFUSED}"
"""
SWITCHED_OFF = "terminal is switched off"
BLIND = f"""\
version: 1
rules:
  - name: terminal-off
    match: {{tool: [terminal, Bash]}}
    deny: "{SWITCHED_OFF}"
"""
DEMO_TEXT = "Demo mode: only read-only tools are available"
DEMO_MODE = f"""\
version: 1
rules:
  - name: demo-mode
    match: {{read_only: false}}
    deny: "{DEMO_TEXT}"
"""
LOOPS = """\
version: 1
rules:
  - name: same-call-repeats
    per: [session, tool, args]
    rate: 3/10 minutes
"""
REPEATED = (
    "Repeated call: terminal was called with the same arguments 3 times in the last "
    "10 minutes; change the arguments or the approach"
)


@contextlib.contextmanager
def audited_daemon(policy: str, directory: Path) -> Iterator[Daemon]:
    """`ratewarden serve` with `policy`, writing each call's args into its audit."""
    env = clean_environment(RATEWARDEN_AUDIT_ARGS="true")
    with running_daemon(policy, directory, env=env) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def reads_args(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with audited_daemon(READS_ARGS, tmp_path_factory.mktemp("reads-args")) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def blind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with audited_daemon(BLIND, tmp_path_factory.mktemp("blind")) as daemon:
        yield daemon


def denials(daemon: Daemon, user: str) -> list[dict[str, Any]]:
    """The daemon's audit entries for `user`, newest first."""
    return read_denials(daemon.url, user)


def commands(tmp_path: Path) -> tuple[str, str, Path]:
    """An `echo` that may run, and an `rm` of a file that must survive it."""
    victim = tmp_path / "victim.txt"
    victim.write_text("still here\n")
    return f"echo kept >> {tmp_path / 'echoed.txt'}", f"rm -f {victim}", victim


def assert_args_arrived(daemon: Daemon, user: str, rm: str) -> None:
    """One refusal for `user`, by the rule that reads the command, holding the command."""
    [entry] = denials(daemon, user)
    assert (entry["rule"], entry["message"]) == ("no-rm", RM_REFUSED)
    assert entry["args"]["command"] == rm


def assert_args_not_sent(daemon: Daemon, user: str) -> None:
    """One refusal for `user`, and no args in it: the client did not send them."""
    [entry] = denials(daemon, user)
    assert entry["rule"] == "terminal-off"
    assert "args" not in entry


def test_the_policy_that_does_not_read_args_still_audits_args_that_are_sent(
    blind: Daemon,
) -> None:
    """The control for every `sends_no_args` test: had a client sent them, they would show."""
    user = new_user("control")
    body = {"user": user, "tool": "terminal", "args": {"command": "rm -rf /home"}}
    with httpx.Client(trust_env=False) as http:
        answer = http.post(f"{blind.url}/v1/check", json=body).raise_for_status().json()
    assert (answer["decision"], answer["send_args"]) == ("deny", False)
    [entry] = denials(blind, user)
    assert entry["args"] == {"command": "rm -rf /home"}


# -- hermes: the plugin and the shell hook, through hermes' own dispatch -----------------


@pytest.fixture(scope="module")
def hermes_python() -> Path:
    return host_python("hermes")


def run_hermes(
    python: Path, work: Path, mode: str, config_yaml: str, **config: Any
) -> dict[str, Any]:
    """args_hermes.py in `mode`, with $HERMES_HOME/config.yaml as given; its report."""
    work.mkdir(parents=True, exist_ok=True)
    home = work / "hermes-home"
    home.mkdir(exist_ok=True)
    (home / "config.yaml").write_text(config_yaml)
    out = work / "report.json"
    config_file = work / "driver.json"
    config_file.write_text(json.dumps({**config, "mode": mode, "out": str(out)}))
    env = {k: v for k, v in clean_environment().items() if not k.startswith("HERMES_")}
    env.update(HERMES_HOME=str(home), HOME=str(work / "os-home"))
    env.update(config.pop("env", {}))
    done = subprocess.run(
        [str(python), str(DRIVERS / "args_hermes.py"), str(config_file)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=work,
        check=False,
    )
    assert done.returncode == 0, f"driver failed:\n{done.stdout}\n{done.stderr}"
    report: dict[str, Any] = json.loads(out.read_text())
    assert "error" not in report, report["error"]
    return report


PLUGIN_CONFIG = """\
plugins:
  enabled: [ratewarden]
security:
  tirith_enabled: false
"""


def hermes_plugin(python: Path, work: Path, daemon: Daemon, *plan: str) -> tuple[str, list[Any]]:
    """The plan through the plugin, for a gateway user of its own; (user, results)."""
    user_id = uuid.uuid4().hex[:8]
    report = run_hermes(
        python,
        work,
        "plugin",
        PLUGIN_CONFIG,
        commands=list(plan),
        user=user_id,
        env={"RATEWARDEN_URL": daemon.url},
    )
    return f"discord:{user_id}", report["results"]


def test_hermes_plugin_sends_the_args_when_the_policy_reads_them(
    hermes_python: Path, reads_args: Daemon, tmp_path: Path
) -> None:
    echo, rm, victim = commands(tmp_path)
    user, (echoed, refused) = hermes_plugin(hermes_python, tmp_path / "h", reads_args, echo, rm)
    assert (echoed["error"], echoed["exit_code"]) == (None, 0)
    assert refused == {"error": RM_REFUSED}
    assert victim.exists()
    assert_args_arrived(reads_args, user, rm)


def test_hermes_plugin_sends_no_args_when_the_policy_does_not_read_them(
    hermes_python: Path, blind: Daemon, tmp_path: Path
) -> None:
    _, rm, victim = commands(tmp_path)
    user, [refused] = hermes_plugin(hermes_python, tmp_path / "h", blind, rm)
    assert refused == {"error": SWITCHED_OFF}
    assert victim.exists()
    assert_args_not_sent(blind, user)


SHELL_CONFIG = """\
security:
  tirith_enabled: false
hooks:
  pre_tool_call:
    - matcher: terminal
      command: {command}
      timeout: 10
"""


def hermes_shell(python: Path, work: Path, daemon: Daemon, *plan: str) -> tuple[str, list[Any]]:
    """The plan through `ratewarden hook hermes` (hermes' venv's own console script)."""
    user = new_user("hermes-shell")
    hook = f"{shlex.quote(str(python.with_name('ratewarden')))} hook hermes"
    command = f"{hook} --url {daemon.url} --user {user}"
    config_yaml = SHELL_CONFIG.format(command=json.dumps(command))
    report = run_hermes(python, work, "shell", config_yaml, commands=list(plan))
    assert report["registered"] == ["pre_tool_call"]
    return user, report["results"]


def test_hermes_shell_hook_sends_the_args_when_the_policy_reads_them(
    hermes_python: Path, reads_args: Daemon, tmp_path: Path
) -> None:
    echo, rm, victim = commands(tmp_path)
    user, (echoed, refused) = hermes_shell(hermes_python, tmp_path / "h", reads_args, echo, rm)
    assert (echoed["error"], echoed["exit_code"]) == (None, 0)
    assert refused == {"error": RM_REFUSED}
    assert victim.exists()
    assert_args_arrived(reads_args, user, rm)


def test_hermes_shell_hook_sends_no_args_when_the_policy_does_not_read_them(
    hermes_python: Path, blind: Daemon, tmp_path: Path
) -> None:
    _, rm, victim = commands(tmp_path)
    user, [refused] = hermes_shell(hermes_python, tmp_path / "h", blind, rm)
    assert refused == {"error": SWITCHED_OFF}
    assert victim.exists()
    assert_args_not_sent(blind, user)


# -- Strands, pydantic-ai-middleware, the OpenAI Agents SDK -----------------------------


def run_framework(host: str, work: Path, daemon: Daemon, *plan: str) -> tuple[str, dict[str, Any]]:
    """args_agents.py for `host` in its venv, for a user of its own; (user, report)."""
    python = host_python(host)
    user = new_user(host)
    work.mkdir(parents=True, exist_ok=True)
    config = {"host": host, "user": user, "commands": list(plan), "work": str(work)}
    report: dict[str, Any] = run_driver(
        python, DRIVERS / "args_agents.py", config, env=clean_environment(RATEWARDEN_URL=daemon.url)
    )
    return user, report


@pytest.mark.parametrize("host", sorted(FRAMEWORKS))
def test_adapter_sends_the_args_when_the_policy_reads_them(
    host: str, reads_args: Daemon, tmp_path: Path
) -> None:
    echo, rm = "echo kept", "rm -rf /home"  # the tools only record what they are given
    user, report = run_framework(host, tmp_path, reads_args, echo, rm)
    echoed, refused = report["results"]
    assert RM_REFUSED not in echoed
    assert RM_REFUSED in refused  # each framework words it its own way around our text
    assert report["ran"] == [echo]
    assert_args_arrived(reads_args, user, rm)


@pytest.mark.parametrize("host", sorted(FRAMEWORKS))
def test_adapter_sends_no_args_when_the_policy_does_not_read_them(
    host: str, blind: Daemon, tmp_path: Path
) -> None:
    user, report = run_framework(host, tmp_path, blind, "rm -rf /home")
    [refused] = report["results"]
    assert SWITCHED_OFF in refused
    assert report["ran"] == []
    assert_args_not_sent(blind, user)


# -- Claude Code (the real CLI) and agent-code (its hook contract) -----------------------


@pytest.fixture(scope="module")
def claude_cli() -> tuple[Path, Path]:
    """The CLI bundled in claude-agent-sdk, and ratewarden's console script beside it."""
    python = host_python("claude_code")
    return bundled_claude(python), python.with_name("ratewarden")


def run_claude(
    claude_cli: tuple[Path, Path], work: Path, daemon: Daemon, command: str
) -> tuple[str, str]:
    """The real `claude -p` asking for Bash once with `command`; (user, what the model read)."""
    cli, ratewarden = claude_cli
    user = new_user("claude")
    home = work / "home"
    home.mkdir(parents=True, exist_ok=True)
    hook = f"{shlex.quote(str(ratewarden))} hook claude-code --url {daemon.url} --user {user}"
    entry = [{"matcher": "Bash", "hooks": [{"type": "command", "command": hook}]}]
    settings = json.dumps({"hooks": {"PreToolUse": entry}})
    argv = [str(cli), "-p", "Clean up.", "--output-format", "json", "--settings", settings]
    with fake_messages_api(command, calls=1) as (url, model):
        done = subprocess.run(
            [*argv, "--allowedTools", "Bash"],
            cwd=work,
            env={
                "PATH": "/usr/local/bin:/usr/bin:/bin",
                "HOME": str(home),
                "ANTHROPIC_BASE_URL": url,
                "ANTHROPIC_API_KEY": "sk-ant-fake",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "DISABLE_AUTOUPDATER": "1",
            },
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    assert done.returncode == 0, f"claude failed:\n{done.stdout}\n{done.stderr}"
    [call] = model.tool_use_ids
    return user, model.tool_results[call]


def test_claude_code_hook_sends_the_args_when_the_policy_reads_them(
    claude_cli: tuple[Path, Path], reads_args: Daemon, tmp_path: Path
) -> None:
    _, rm, victim = commands(tmp_path)
    user, result = run_claude(claude_cli, tmp_path, reads_args, rm)
    assert RM_REFUSED in result
    assert victim.exists()
    assert_args_arrived(reads_args, user, rm)
    # Claude Code's whole tool_input arrived, its own fields included.
    [entry] = denials(reads_args, user)
    assert entry["args"] == {"command": rm, "description": "Append a line"}


def test_claude_code_hook_sends_no_args_when_the_policy_does_not_read_them(
    claude_cli: tuple[Path, Path], blind: Daemon, tmp_path: Path
) -> None:
    _, rm, victim = commands(tmp_path)
    user, result = run_claude(claude_cli, tmp_path, blind, rm)
    assert SWITCHED_OFF in result
    assert victim.exists()
    assert_args_not_sent(blind, user)


def agent_code(daemon: Daemon, user: str, tool_input: Any) -> subprocess.CompletedProcess[str]:
    """The hook spawned as agent-code spawns it: `bash -c`, the tool's input + newline on
    stdin, the event and tool in AGENT_CODE_HOOK_* variables."""
    context = json.dumps(tool_input)
    env = clean_environment(
        AGENT_CODE_HOOK_EVENT="pre_tool_use",
        AGENT_CODE_HOOK_TOOL="Bash",
        AGENT_CODE_HOOK_CONTEXT=context,
    )
    return subprocess.run(
        ["bash", "-c", f"{shlex.quote(str(RATEWARDEN))} hook agent-code --url {daemon.url}"],
        input=context + "\n",
        capture_output=True,
        text=True,
        env={**env, "RATEWARDEN_USER": user},
        timeout=30,
        check=False,
    )


def test_agent_code_hook_sends_the_args_when_the_policy_reads_them(reads_args: Daemon) -> None:
    user = new_user("agent-code")
    assert agent_code(reads_args, user, {"command": "ls -la"}).returncode == 0
    refused = agent_code(reads_args, user, {"command": "rm -rf /home"})
    assert refused.returncode == 1
    assert refused.stderr.splitlines()[0] == RM_REFUSED  # agent-code's veto reason
    assert_args_arrived(reads_args, user, "rm -rf /home")


def test_agent_code_hook_sends_no_args_when_the_policy_does_not_read_them(blind: Daemon) -> None:
    user = new_user("agent-code")
    refused = agent_code(blind, user, {"command": "rm -rf /home"})
    assert (refused.returncode, refused.stderr.splitlines()[0]) == (1, SWITCHED_OFF)
    assert_args_not_sent(blind, user)


def test_arguments_the_daemon_would_not_take_are_bounded_not_left_out(reads_args: Daemon) -> None:
    """Not a JSON object, or past the wire's caps: the call is still checked, never as one
    without arguments (issue 25): unreadable arguments meet the rule's condition, and an
    `rm` padded past the caps is read as `rm`, while an `ls` padded alike runs."""
    user = new_user("agent-code")
    too_many_items = {"command": "rm -rf /home", "files": list(range(5000))}
    for tool_input in ["rm -rf /home", ["rm", "-rf"], too_many_items]:
        answer = agent_code(reads_args, user, tool_input)
        assert answer.returncode == 1, tool_input
        assert answer.stderr.splitlines()[0] == RM_REFUSED  # agent-code's veto reason
    padded_ls = {"command": "ls -la", "files": list(range(5000))}
    assert agent_code(reads_args, user, padded_ls).returncode == 0


# -- end to end: hermes' AIAgent loop ----------------------------------------------------


def hermes_loop(python: Path, work: Path, daemon: Daemon, plan: list[str]) -> list[Any]:
    """The plan as one AIAgent conversation; the tool results the model read, in order."""
    report = run_hermes(
        python,
        work,
        "loop",
        PLUGIN_CONFIG,
        commands=plan,
        user="1234",
        env={"RATEWARDEN_URL": daemon.url},
    )
    assert report["asked"] == len(plan)
    assert report["final"] == "Done."
    results: list[Any] = report["results"]
    assert len(results) == len(plan)
    return results


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_demo_mode_refuses_terminal_in_the_agent_loop(hermes_python: Path, tmp_path: Path) -> None:
    ran = tmp_path / "ran.txt"
    with audited_daemon(DEMO_MODE, tmp_path / "daemon") as daemon:
        [result] = hermes_loop(hermes_python, tmp_path / "h", daemon, [f"echo hi >> {ran}"])
        [entry] = denials(daemon, "discord:1234")
    assert result == {"error": DEMO_TEXT}  # what the model read, as hermes hands it over
    assert lines(ran) == []
    assert (entry["rule"], entry["tool"]) == ("demo-mode", "terminal")


def test_the_fourth_identical_call_is_a_repeated_call_a_different_one_runs(
    hermes_python: Path, tmp_path: Path
) -> None:
    ran = tmp_path / "ran.txt"
    same, different = f"echo same >> {ran}", f"echo different >> {ran}"
    with audited_daemon(LOOPS, tmp_path / "daemon") as daemon:
        results = hermes_loop(hermes_python, tmp_path / "h", daemon, [same] * 4 + [different])
        [entry] = denials(daemon, "discord:1234")
    for ran_ok in [*results[:3], results[4]]:
        assert (ran_ok["error"], ran_ok["exit_code"]) == (None, 0)
    assert results[3] == {"error": REPEATED}
    assert lines(ran) == ["same", "same", "same", "different"]
    assert (entry["rule"], entry["args"]) == ("same-call-repeats", {"command": same})
