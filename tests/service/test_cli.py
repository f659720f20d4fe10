"""The `ratewarden` command: policy check/explain in-process, and `serve`, `check` and
`usage` as real processes talking over real sockets (to the memory store and to Redis)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import cast

import httpx
import pytest

from ratewarden.arguments import digest
from ratewarden.cli import main
from ratewarden.policy import PolicyError, load_example_policy, load_policy
from tests.helpers.daemon import (
    Daemon,
    clean_environment,
    running_daemon,
    wait_until_healthy,  # noqa: F401  (imported from here)
)
from tests.helpers.redis_server import RedisServer, free_port

POLICIES = Path(__file__).resolve().parents[1] / "policies"
SPEC_EXAMPLE = POLICIES / "good" / "spec_example.yaml"

CLI_POLICY = """\
version: 1
rules:
  - name: terminal-per-minute
    match: {tool: terminal}
    rate: 1/minute
  - name: deploy-needs-approval
    match: {tool: deploy}
    rate: 0/minute
    on_exceed: ask
"""
DENY_LINE = re.compile(r"^Rate limit: max 1 terminal calls per minute \(retry in (\d+s|1m)\)$")


def ratewarden(
    *args: str, cwd: Path | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ratewarden", *args],
        cwd=cwd,
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# Other test modules import `serving` (and `Daemon`, `wait_until_healthy`) from here.
serving = running_daemon


def client(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    """`ratewarden check|usage ...` against `daemon`."""
    command, *rest = args
    return ratewarden(command, "--url", daemon.url, *rest)


def usage_rows(stdout: str) -> list[list[str]]:
    """The table's rows as cells, the header checked on the way."""
    lines = stdout.splitlines()
    header = ["RULE", "KIND", "LIMIT", "USED", "REMAINING", "RESETS", "IN", "MODE"]
    assert lines[1].split() == header, stdout
    return [line.split() for line in lines[2:]]


# -- policy check -----------------------------------------------------------------------


def test_policy_check_accepts_a_good_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "check", str(SPEC_EXAMPLE)]) == 0
    out, err = capsys.readouterr()
    version = load_policy(SPEC_EXAMPLE).version
    assert out == f"{SPEC_EXAMPLE}: ok (version {version}, 5 rules)\n"
    assert err == ""


def test_policy_check_lists_every_error_of_every_bad_file(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bad = [POLICIES / "bad" / "several_reference_errors.yaml", POLICIES / "bad" / "per_twice.yaml"]
    good = POLICIES / "good" / "every_rate_syntax.yaml"
    assert main(["policy", "check", str(bad[0]), str(good), str(bad[1])]) == 1
    out, err = capsys.readouterr()
    assert out == f"{good}: ok (version {load_policy(good).version}, 21 rules)\n"
    expected = []
    for path in bad:
        with pytest.raises(PolicyError) as raised:
            load_policy(path)
        expected += raised.value.lines()
    assert err.splitlines() == expected
    assert len(expected) == 5
    assert expected[0] == f"{bad[0]}:5: rules[1].name: duplicate rule name 'a'"


def test_policy_check_of_a_missing_file_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.yaml"
    assert main(["policy", "check", str(missing)]) == 1
    assert capsys.readouterr().err == (
        f"{missing}: (top level): cannot read: No such file or directory\n"
    )


def test_policy_check_through_the_installed_command() -> None:
    command = Path(sys.executable).parent / "ratewarden"
    bad = POLICIES / "bad" / "rate_in_words.yaml"
    done = subprocess.run(
        [str(command), "policy", "check", str(SPEC_EXAMPLE), str(bad)],
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 1
    assert done.stdout.startswith(f"{SPEC_EXAMPLE}: ok ")
    assert done.stderr == (
        f'{bad}:4: rules[0].rate: expected "N/window" '
        '(e.g. "10/minute", "5/10 minutes"), got \'ten per minute\' '
        "(rule 'terminal-per-minute')\n"
    )


# -- policy explain ---------------------------------------------------------------------


def explain(capsys: pytest.CaptureFixture[str], *args: str, code: int = 0) -> list[str]:
    """The rule-by-rule summary (each rule's conditions and counter key, indented below
    it, are test_explain_shows_each_condition_and_the_counter_key's)."""
    lines = explain_all(capsys, *args, code=code)
    return [line for line in lines if not line.startswith(DETAIL)]


DETAIL = " " * 11


def explain_all(capsys: pytest.CaptureFixture[str], *args: str, code: int = 0) -> list[str]:
    """Every line but the closing decision (which exits as `ratewarden check` would:
    `code`; test_explain_decides_as_check_would's)."""
    assert main(["policy", "explain", *args]) == code
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert lines[-2] == ""
    assert lines[-1].startswith("decision: ")
    return lines[:-2]


ARGS_POLICY = """version: 1
groups: {staff: [alice]}
rules:
  - name: terminal-for-staff
    match: {tool: terminal}
    unless: {group: staff}
    deny: "terminal is available to staff accounts only"
  - name: no-root-delete
    match:
      tool: terminal
      args: {command: {regex: '\\brm\\s+-rf\\s+/(\\s|$)'}, "options.force": true}
    deny: "Refusing destructive root delete"
  - name: same-call-repeats
    per: [session, tool, args]
    rate: 3/10 minutes
  - name: per-site
    per: [user, args.url]
    rate: 20/minute
"""


def test_explain_shows_each_condition_and_the_counter_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(ARGS_POLICY)
    given = '{"options": {"force": true}, "command": "sudo rm -rf /"}'
    lines = explain_all(
        capsys, str(policy), "--user", "bob", "--tool", "terminal", "--session", "s1",
        "--args", given, code=1,
    )  # fmt: skip
    same = digest({"command": "sudo rm -rf /", "options": {"force": True}})
    assert "args: given (counter keys hold a digest of them, never their text)" in lines
    start = lines.index("") + 1
    assert lines[start:] == [
        "  APPLIES  terminal-for-staff: access: deny 'terminal is available to staff accounts "
        "only' (rule default); enforce",
        f"{DETAIL}held   tool in ['terminal']",
        f"{DETAIL}failed unless group in ['staff']",
        "  APPLIES  no-root-delete: access: deny 'Refusing destructive root delete' (rule "
        "default); enforce",
        f"{DETAIL}held   tool in ['terminal']",
        f"{DETAIL}held   args.command matches regex '\\brm\\s+-rf\\s+/(\\s|$)'",
        f"{DETAIL}held   args.options.force is true",
        "  APPLIES  same-call-repeats: rate 3/10 minutes (rule default) per session, tool, "
        "args; sliding_window, enforce, on_exceed deny",
        f"{DETAIL}counter key: rw:{{same-call-repeats|session=s1|tool=terminal|args={same}}}:sw"
        "  (args parts are digests of the arguments)",
        "  APPLIES  per-site: rate 20/minute (rule default) per user, args.url; "
        "sliding_window, enforce, on_exceed deny",
        f"{DETAIL}counter key: rw:{{per-site|user=bob|args[url]=}}:sw"
        "  (args parts are digests of the arguments)",
    ]
    # The same call by a staff member, with arguments that match no condition.
    lines = explain_all(
        capsys, str(policy), "--user", "alice", "--tool", "terminal", "--args",
        '{"command": "ls /", "url": "https://example.org"}',
    )  # fmt: skip
    assert lines[lines.index("") + 1 :][:6] == [
        "  skip     terminal-for-staff: its unless: matches the call",
        f"{DETAIL}held   tool in ['terminal']",
        f"{DETAIL}held   unless group in ['staff']",
        "  skip     no-root-delete: args.command does not match regex '\\brm\\s+-rf\\s+/(\\s|$)'",
        f"{DETAIL}held   tool in ['terminal']",
        f"{DETAIL}failed args.command matches regex '\\brm\\s+-rf\\s+/(\\s|$)'",
    ]
    url = digest("https://example.org")
    assert f"{DETAIL}counter key: rw:{{per-site|user=alice|args[url]={url}}}:sw" in lines[-1]
    assert "example.org" not in "\n".join(lines)  # no argument's text, anywhere


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ("[1, 2]", "Input should be a valid dictionary"),
        ("{", "Invalid JSON"),
        ('{"a": NaN}', "numbers must be finite"),
    ],
)
def test_explain_refuses_args_that_are_not_a_json_object(
    capsys: pytest.CaptureFixture[str], given: str, problem: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(
            ["policy", "explain", str(SPEC_EXAMPLE), "--user", "u", "--tool", "t", "--args", given]
        )
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --args: not a JSON object of arguments" in err
    assert problem in err


def test_explain_names_applying_and_skipped_rules_with_override_sources(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = explain(capsys, str(SPEC_EXAMPLE), "--user", "alice", "--tool", "terminal")
    version = load_policy(SPEC_EXAMPLE).version
    assert lines == [
        f"policy {SPEC_EXAMPLE} (version {version}, 5 rules)",
        "call: user='alice' tool='terminal' session=None team=None",
        "user's groups: pro",
        "tool metadata: read_only=False, destructive=True, idempotent=False, open_world=True, "
        "requires_confirmation=False (unset fields take the MCP defaults)",
        "",
        "  APPLIES  terminal-per-minute: rate 100/minute (overrides[0]) per user; "
        "sliding_window, enforce, on_exceed deny",
        "  skip     browser-concurrency: tool 'terminal' is not in ['browser_*']",
        "  APPLIES  destructive-per-hour: rate 3/hour (rule default) per user; "
        "sliding_window, enforce, on_exceed ask",
        # alice is in the group pro: its override sets her budget.
        "  APPLIES  daily-spend: budget 50.00/day USD (overrides[1]) per user; "
        "budget, enforce, on_exceed deny",
        "  APPLIES  all-tools-burst: rate 30/minute (rule default) per user, tool; "
        "token_bucket, enforce, on_exceed deny",
    ]
    browser = explain(capsys, str(SPEC_EXAMPLE), "--user", "bob", "--tool", "browser_open")
    assert browser[5:7] == [
        "  skip     terminal-per-minute: tool 'browser_open' is not in ['terminal']",
        "  APPLIES  browser-concurrency: concurrency 2 (lease 600s) (rule default) per user; "
        "concurrency, enforce, on_exceed deny",
    ]
    assert browser[8] == (
        "  APPLIES  daily-spend: budget 5.00/day USD (rule default) per user; "
        "budget, enforce, on_exceed deny"
    )


def test_explain_with_metadata_flags(capsys: pytest.CaptureFixture[str]) -> None:
    lines = explain(
        capsys, str(SPEC_EXAMPLE), "--user", "banned-7", "--tool", "web_search",
        "--no-destructive",
    )  # fmt: skip
    assert lines[2:] == [
        "user's groups: (none)",
        "tool metadata: read_only=False, destructive=False, idempotent=False, open_world=True, "
        "requires_confirmation=False (unset fields take the MCP defaults)",
        "",
        "  skip     terminal-per-minute: tool 'web_search' is not in ['terminal']",
        "  skip     browser-concurrency: tool 'web_search' is not in ['browser_*']",
        "  skip     destructive-per-hour: destructive is False (given), rule wants True",
        "  APPLIES  daily-spend: budget 5.00/day USD (rule default) per user; "
        "budget, enforce, on_exceed deny",
        "  APPLIES  all-tools-burst: rate 30/minute (rule default) per user, tool; "
        "token_bucket, enforce, on_exceed deny",
    ]
    banned = explain(capsys, str(SPEC_EXAMPLE), "--user", "banned-7", "--tool", "terminal",
                     "--destructive", code=1)  # fmt: skip
    assert banned[5] == (
        "  APPLIES  terminal-per-minute: rate 0/minute (overrides[2]) per user; "
        "sliding_window, enforce, on_exceed deny"
    )
    assert banned[7].startswith("  APPLIES  destructive-per-hour: rate 3/hour (rule default)")


def test_explain_with_tags_sessions_unlimited_and_global_counters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("""\
version: 1
defaults: {mode: shadow}
rules:
  - {name: net, match: {tags: [net]}, per: [], rate: 5/10 minutes}
  - {name: fs, match: {tags: [fs], read_only: true}, rate: 2/second}
  - {name: in-session, match: {session: "s-*"}, per: [user, session], rate: 1/hour}
overrides:
  - {users: [root], rule: net, unlimited: true}
""")
    lines = explain(
        capsys, str(path), "--user", "root", "--tool", "curl", "--tag", "net", "--tag", "x",
        "--read-only", "--session", "s-9",
    )  # fmt: skip
    assert lines[1] == "call: user='root' tool='curl' session='s-9' team=None"
    assert lines[3].startswith("tool metadata: read_only=True, destructive=False, ")
    assert lines[5:] == [
        "  APPLIES  net: unlimited (overrides[0]) per everyone (one global counter); "
        "sliding_window, shadow, on_exceed deny",
        "  skip     fs: call has none of the tags ['fs']",
        "  APPLIES  in-session: rate 1/hour (rule default) per user, session; "
        "sliding_window, shadow, on_exceed deny",
    ]


def test_explain_of_a_bad_file_prints_its_errors(capsys: pytest.CaptureFixture[str]) -> None:
    bad = POLICIES / "bad" / "unknown_group.yaml"
    assert main(["policy", "explain", str(bad), "--user", "u", "--tool", "t"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"{bad}:6: rules[0].match.group: unknown group 'staff' (rule 'r')\n"


def test_explain_needs_user_and_tool(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        main(["policy", "explain", str(SPEC_EXAMPLE), "--tool", "t"])
    assert raised.value.code == 2
    assert "the following arguments are required: --user" in capsys.readouterr().err


# -- serve, check, usage (real processes) -----------------------------------------------


def test_serve_with_no_flags_uses_the_memory_store_and_the_packaged_policy(
    tmp_path: Path,
) -> None:
    example = load_example_policy()
    with running_daemon(tmp_path) as daemon:
        log = daemon.log_text()
        ready = [line for line in log.splitlines() if " ready on " in line]
        assert len(ready) == 1, log
        assert f"ready on http://127.0.0.1:{daemon.port} " in ready[0]
        assert "| store memory:// (embedded, this process only" in ready[0]
        assert "ratewarden-state.json" in ready[0]  # where the embedded store keeps its state
        rules = len(example.rules)
        assert ready[0].endswith(
            f"| policy <packaged example.yaml> (version {example.version}, {rules} rules)"
        )
        with httpx.Client(trust_env=False) as http:
            assert http.get(f"{daemon.url}/v1/policy").json()["version"] == example.version
            assert http.get(f"{daemon.url}/readyz").status_code == 200
        allowed = client(daemon, "check", "--user", "discord:1234", "--tool", "terminal")
        assert (allowed.returncode, allowed.stderr) == (0, "")
        assert re.fullmatch(r"allow call_id=\S+\n", allowed.stdout), allowed.stdout
        usage = client(daemon, "usage", "--user", "discord:1234", "--tool", "terminal")
        assert usage.returncode == 0, usage.stderr
        assert usage.stdout.splitlines()[0] == "usage for discord:1234, tool terminal"
        rows = usage_rows(usage.stdout)
        assert [row[0] for row in rows] == [
            "no-root-delete",  # an access rule: listed, nothing counted
            "terminal-per-minute",
            "destructive-per-hour",
            "all-tools-burst",
            "daily-spend",
        ]
        assert rows[0][1] == "access"
        budget_line = usage.stdout.splitlines()[6]
        assert budget_line.split()[:7] == [
            "daily-spend",
            "budget",
            "5.00",
            "USD/day",
            "0.00",
            "5.00",
            "-",
        ]
        terminal = rows[1]
        assert terminal[1:5] == ["rate", "10/minute", "1", "9"]
        assert re.fullmatch(r"\d+s", terminal[5])
        assert terminal[6] == "enforce"
    assert daemon.process.returncode is not None


def test_serve_picks_up_ratewarden_yaml_in_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "ratewarden.yaml").write_text(CLI_POLICY)
    with running_daemon(tmp_path) as daemon:
        assert "| policy ratewarden.yaml (version " in daemon.log_text()
        with httpx.Client(trust_env=False) as http:
            rules = http.get(f"{daemon.url}/v1/policy").json()["policy"]["rules"]
        assert [r["name"] for r in rules] == ["terminal-per-minute", "deploy-needs-approval"]


def test_check_exit_codes_and_usage_table(tmp_path: Path) -> None:
    policy = tmp_path / "cli.yaml"
    policy.write_text(CLI_POLICY)
    with running_daemon(tmp_path, "--policy", str(policy)) as daemon:
        assert f"| policy {policy} (version " in daemon.log_text()

        allowed = client(daemon, "check", "--user", "u", "--tool", "terminal")
        assert (allowed.returncode, allowed.stderr) == (0, "")
        assert allowed.stdout.startswith("allow call_id="), allowed.stdout

        denied = client(daemon, "check", "--user", "u", "--tool", "terminal", "--call-id", "c-d")
        assert denied.returncode == 1
        assert DENY_LINE.match(denied.stderr.splitlines()[0]), denied.stderr
        assert re.fullmatch(r"deny call_id=c-d retry_after=[\d.]+\n", denied.stdout)

        asked = client(daemon, "check", "--user", "u", "--tool", "deploy", "--session", "s-1")
        assert asked.returncode == 3
        assert asked.stderr.splitlines()[0] == "Rate limit: max 0 deploy calls per minute"
        assert asked.stdout.startswith("ask call_id=")

        approved = client(daemon, "check", "--user", "u", "--tool", "deploy", "--approved",
                                 "--json", "--call-id", "call_abc")  # fmt: skip
        assert approved.returncode == 0, approved.stderr
        assert '"decision": "allow"' in approved.stdout
        assert '"call_id": "call_abc"' in approved.stdout
        assert '"approved": true' in approved.stdout

        other = client(daemon, "check", "--user", "v", "--tool", "terminal", "--destructive",
                              "--tag", "shell", "--cost", "0.5")  # fmt: skip
        assert other.returncode == 0, other.stderr

        usage = client(daemon, "usage", "--user", "u")
        assert usage.returncode == 0, usage.stderr
        assert usage.stdout.splitlines()[0] == "usage for u"
        rows = usage_rows(usage.stdout)
        assert [row[0] for row in rows] == ["terminal-per-minute", "deploy-needs-approval"]
        assert rows[0][:5] + rows[0][6:] == ["terminal-per-minute", "rate", "1/minute", "1", "0",
                                             "enforce"]  # fmt: skip
        assert re.fullmatch(r"\d+s", rows[0][5])
        assert rows[1][1:3] + rows[1][4:5] == ["rate", "0/minute", "0"]
        nothing = client(daemon, "usage", "--user", "u", "--tool", "x")
        assert (nothing.returncode, nothing.stdout) == (
            0,
            "usage for u, tool x\n(no rules apply)\n",
        )

        refused = client(daemon, "check", "--user", "u" * 257, "--tool", "terminal")
        assert refused.returncode == 2
        assert refused.stderr.startswith("ratewarden: ")
        assert "user" in refused.stderr


def test_check_exits_4_when_the_daemon_is_unreachable() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = ratewarden("check", "--url", url, "--user", "u", "--tool", "terminal")
    assert done.returncode == 4
    assert done.stderr.splitlines()[0].startswith(f"ratewarden daemon unreachable at {url}: ")
    usage = ratewarden("usage", "--url", url, "--user", "u")
    assert usage.returncode == 4


def test_check_refuses_a_bad_flag_value_before_calling() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = ratewarden("check", "--url", url, "--user", "u", "--tool", "t", "--cost", "-1")
    assert done.returncode == 2
    assert done.stderr == "ratewarden: --cost: Input should be greater than or equal to 0\n"


def test_serve_refuses_several_workers_on_the_memory_store(tmp_path: Path) -> None:
    done = ratewarden("serve", "--workers", "2", "--port", str(free_port()), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == (
        "ratewarden: the embedded memory:// store lives in one process; use --workers 1, "
        "or a shared store such as --store-url redis://localhost:6379/0\n"
    )


def test_serve_with_an_invalid_policy_lists_its_errors(tmp_path: Path) -> None:
    bad = POLICIES / "bad" / "several_reference_errors.yaml"
    done = ratewarden("serve", "--policy", str(bad), "--port", str(free_port()), cwd=tmp_path)
    assert done.returncode == 2
    with pytest.raises(PolicyError) as raised:
        load_policy(bad)
    assert done.stderr.splitlines() == ["cannot load the policy:", *raised.value.lines()]


def test_serve_with_an_invalid_policy_in_the_working_directory_refuses(tmp_path: Path) -> None:
    (tmp_path / "ratewarden.yaml").write_text("version: 1\nrules:\n  - {name: r, rate: ten}\n")
    done = ratewarden("serve", "--port", str(free_port()), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines()[1].startswith("ratewarden.yaml:3: rules[0].rate: expected ")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--port", "70000"], "ratewarden: --port: Input should be less than or equal to 65535"),
        (["--port", "-1"], "ratewarden: --port: Input should be greater than or equal to 0"),
        (["--workers", "0"], "ratewarden: --workers: Input should be greater than or equal to 1"),
        (["--store-timeout-ms", "0"], "ratewarden: --store-timeout-ms: Input should be greater"),
        (["--port", "abc"], "argument --port: invalid int value: 'abc'"),
        (["--fail", "maybe"], "argument --fail: invalid choice: 'maybe'"),
        (["--store-url", "foo://x"], "ratewarden: unsupported store URL 'foo://x'"),
        (["--store-url", "redis+sentinel://h"], "name the master's service"),
        (["--store-url", "redis+cluster://h:x"], "bad port 'x'"),
    ],
)
@pytest.mark.slow
def test_serve_names_the_bad_flag(tmp_path: Path, flags: list[str], message: str) -> None:
    done = ratewarden("serve", *flags, cwd=tmp_path)
    assert done.returncode == 2
    assert message in done.stderr, done.stderr


@pytest.mark.redis
def test_serve_on_a_real_redis(tmp_path: Path, redis_server: RedisServer, redis_url: str) -> None:
    policy = tmp_path / "cli.yaml"
    policy.write_text(CLI_POLICY)
    with running_daemon(tmp_path, "--store-url", redis_url, "--policy", str(policy)) as daemon:
        assert f"| store {redis_url} |" in daemon.log_text()
        allowed = client(daemon, "check", "--user", "discord:1234", "--tool", "terminal")
        assert allowed.returncode == 0, allowed.stderr
        denied = client(daemon, "check", "--user", "discord:1234", "--tool", "terminal")
        assert denied.returncode == 1
        assert DENY_LINE.match(denied.stderr.splitlines()[0]), denied.stderr
        usage = client(daemon, "usage", "--user", "discord:1234", "--tool", "terminal")
        assert [row[:5] for row in usage_rows(usage.stdout)] == [
            ["terminal-per-minute", "rate", "1/minute", "1", "0"]
        ]
    # The counter, and the recent-denials list the denied call was audited into, shared
    # and the user's own. Beside the fleet's bookkeeping (each process's report:
    # docs/operations.md) and who was refused (docs/observability.md), each its own prefix.
    keys = sorted(cast("list[bytes]", redis_server.client().keys("*")))  # not decoded
    bookkeeping = (b"rw:admin:", b"rw:activity:")
    assert [k for k in keys if not k.startswith(bookkeeping)] == [
        b"rw:denials",
        b"rw:denials:{users}",
        b"rw:denials:{users}:discord%3A1234",
        b"rw:{terminal-per-minute|user=discord%3A1234}:sw",
    ]
    assert b"rw:admin:{overrides}:reports" in keys


def test_serve_flags_are_the_settings_fields_with_their_defaults(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each `serve` flag sets the field it names, and its help shows the field's own
    default: a default changed in Settings cannot be left stale in --help."""
    import argparse

    from ratewarden.cli import build_parser, serve
    from ratewarden.service.settings import Settings

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    actions = {a.dest: a for a in commands.choices["serve"]._actions}
    for name in serve.FLAGS:
        field = Settings.model_fields[name]
        default = field.get_default(call_default_factory=True)
        action = actions[name]
        assert action.default is None  # unset flags fall back to the environment
        if default is not None:
            assert f"(default {default})" in (action.help or ""), name
    assert actions["fail"].choices == ["open", "closed"]
    assert actions["log_level"].choices == ["debug", "info", "warning", "error"]
    assert actions["port"].type is int
    assert actions["request_timeout_s"].type is float


# -- check then settle, from a shell (item: the CLI shows what it decided) ---------------

SPEND_POLICY = """\
version: 1
rules:
  - {name: spend, per: [user], budget: 1.00/day, currency: USD, soft_limit: 50%}
"""
SOFT_WARNING = "Budget soft limit: web tools at 70% of 1.00 USD this day (spend)"


def test_check_prints_its_call_id_and_warnings_so_settle_can_follow(tmp_path: Path) -> None:
    (tmp_path / "ratewarden.yaml").write_text(SPEND_POLICY)
    with running_daemon(tmp_path) as daemon:
        first = client(daemon, "check", "--user", "u", "--tool", "web", "--cost", "0.4")
        assert (first.returncode, first.stderr) == (0, "")
        [line] = first.stdout.splitlines()
        decision, call_id = line.split(" ")
        assert decision == "allow"
        assert call_id.startswith("call_id=")
        settled = client(daemon, "settle", call_id.removeprefix("call_id="), "--cost", "0.6")
        assert (settled.returncode, settled.stderr) == (0, "")
        assert settled.stdout == f"{call_id.removeprefix('call_id=')}: settled (spend 0.60)\n"

        warned = client(daemon, "check", "--user", "u", "--tool", "web", "--cost", "0.1")
        assert (warned.returncode, warned.stderr) == (0, "")
        assert warned.stdout.splitlines()[1:] == [f"warning: {SOFT_WARNING}"]

        as_json = client(daemon, "check", "--user", "u", "--tool", "web", "--json")
        assert as_json.returncode == 0
        answer = httpx.Response(200, content=as_json.stdout).json()
        assert (answer["decision"], answer["warnings"]) == ("allow", [SOFT_WARNING])
        assert answer["call_id"] != call_id.removeprefix("call_id=")


@pytest.mark.parametrize("command", ["check", "settle", "usage", "spend"])
def test_every_exit_code_of_a_client_command_is_in_its_help(command: str) -> None:
    from ratewarden.cli.common import EXIT_CODES

    shown = ratewarden(command, "--help")
    assert shown.returncode == 0
    epilog = shown.stdout.partition("exit status:\n")[2]
    assert [int(line.split()[0]) for line in epilog.splitlines() if line[2:3].isdigit()] == (
        sorted(EXIT_CODES[command])
    )
    assert "RATEWARDEN_TOKEN" in epilog
    assert "--token" in epilog


def test_an_auth_refusal_names_the_variable_and_the_flag(tmp_path: Path) -> None:
    (tmp_path / "ratewarden.yaml").write_text(SPEND_POLICY)
    with running_daemon(tmp_path, "--api-token", "good-token") as daemon:
        for command in (["check", "--tool", "t", "--user", "u"], ["usage", "--user", "u"],
                        ["settle", "c1"]):  # fmt: skip
            missing = client(daemon, *command)
            assert missing.returncode == 2, missing.stderr
            assert missing.stderr == (
                f"ratewarden: the daemon at {daemon.url} needs a token: set RATEWARDEN_TOKEN "
                "(or pass --token TOKEN)\n"
            )
            wrong = client(daemon, *command, "--token", "bad-token")
            assert wrong.returncode == 2, wrong.stderr
            assert wrong.stderr.startswith(
                f"ratewarden: the daemon at {daemon.url} refused the token from --token "
                "(invalid bearer token): set RATEWARDEN_TOKEN"
            )
            assert "header" not in missing.stderr + wrong.stderr
        allowed = client(daemon, "check", "--tool", "t", "--user", "u", "--token", "good-token")
        assert allowed.returncode == 0, allowed.stderr


# -- serve on a busy port ----------------------------------------------------------------


def serve_on_a_busy_port(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """`ratewarden serve` on a port another socket listens on."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = ratewarden("serve", "--port", str(port), *flags, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert " ready on " not in done.stdout + done.stderr, done.stderr
    assert "Uvicorn running" not in done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"ratewarden: cannot listen on 127.0.0.1:{port}: port {port} is already in use "
        "(another ratewarden?); stop it, or choose another port with --port or RATEWARDEN_PORT"
    )
    return done


def test_serve_on_a_busy_port_never_says_ready(tmp_path: Path) -> None:
    serve_on_a_busy_port(tmp_path)


@pytest.mark.redis
def test_serve_with_workers_on_a_busy_port_never_says_ready(tmp_path: Path, redis_url: str) -> None:
    serve_on_a_busy_port(tmp_path, "--workers", "2", "--store-url", redis_url)
