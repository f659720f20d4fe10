"""`ratewarden reset` (issue 26, item 6) against a real daemon on a real redis-server: it
says what it forgot, the daemon audits and counts it, it asks first at a terminal (a real
pseudo-terminal), and its refusals name the flag, with `override`'s exit codes."""

from __future__ import annotations

import json
import os
import pty
import re
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.daemon import Daemon, clean_environment, run_cli, running_daemon
from tests.helpers.redis_server import running_redis
from tests.service.test_resets import ADMIN, AS_ADMIN, AS_CHECK, CHECK, POLICY, SPEND


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Any:
    directory = tmp_path_factory.mktemp("resets")
    policy = directory / "policy.yaml"
    policy.write_text(POLICY)
    env = clean_environment(
        RATEWARDEN_ADMIN_TOKENS=ADMIN,
        RATEWARDEN_ADMIN_NAMES="ops-ana",
        RATEWARDEN_API_TOKENS=CHECK,
    )
    with (
        running_redis(directory / "redis") as redis_server,
        running_daemon(
            directory, "--store-url", redis_server.url, "--policy", str(policy), env=env
        ) as serving_daemon,
    ):
        yield serving_daemon


def spend_on(daemon: Daemon, user: str) -> None:
    """As spend_and_count, through the real daemon."""
    with httpx.Client(base_url=daemon.url, trust_env=False, timeout=5) as http:
        for body in (
            {"user": user, "tool": "browser", "cost": 1.5, "call_id": f"{user}-b1"},
            {"user": user, "tool": "browser", "cost": 0.5, "call_id": f"{user}-b2"},
        ):
            assert http.post("/v1/check", json=body, headers=AS_CHECK).json()["allowed"]
        settled = http.post(f"/v1/calls/{user}-b1/settle", json={"cost": 1.2}, headers=AS_CHECK)
        assert settled.status_code == 200


def used_on(daemon: Daemon, user: str) -> dict[str, Any]:
    with httpx.Client(base_url=daemon.url, trust_env=False, timeout=5) as http:
        found = http.get("/v1/usage", params={"user": user}, headers=AS_ADMIN).json()
    return {item["rule"]: (item["used"], item.get("reserved")) for item in found["limits"]}


def audited_in_log(daemon: Daemon, user: str, within_s: float = 5.0) -> list[dict[str, Any]]:
    """The daemon's counters_reset audit lines for `user` (its log is written as it goes)."""
    deadline = time.monotonic() + within_s
    while True:
        found = [
            json.loads(match)
            for match in re.findall(r'(\{"event": "counters_reset".*\})', daemon.log_text())
        ]
        mine = [line for line in found if line["user"] == user]
        if mine or time.monotonic() > deadline:
            return mine
        time.sleep(0.1)


def test_cli_reset_forgets_a_users_budget_and_says_what(daemon: Daemon) -> None:
    spend_on(daemon, "carol")
    done = run_cli(
        "reset", "--url", daemon.url, "--token", ADMIN, "--user", "carol", "--rule", "daily-spend"
    )
    assert done.returncode == 0, done.stderr
    assert "forgot 1.20 USD spent (+0.50 reserved) on daily-spend" in done.stdout
    assert used_on(daemon, "carol")["daily-spend"] == (0.0, 0.0)
    [line] = audited_in_log(daemon, "carol")
    assert (line["by"], line["rule"], line["forgotten"]) == ("ops-ana", "daily-spend", [SPEND])
    with httpx.Client(base_url=daemon.url, trust_env=False, timeout=5) as http:
        metrics = http.get("/metrics").text
    assert 'ratewarden_resets_total{target="user_rule"} 1.0' in metrics


def test_cli_reset_takes_the_token_from_the_environment_and_answers_json(
    daemon: Daemon,
) -> None:
    spend_on(daemon, "erin")
    env = clean_environment(RATEWARDEN_TOKEN=ADMIN, RATEWARDEN_URL=daemon.url)
    done = run_cli("reset", "--user", "erin", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"deleted": 1, "forgotten": [SPEND]}


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        ((), 2, "--user or --rule: name a user, a rule, or both"),
        (("--rule", "no-such-rule"), 2, "--rule: unknown rule 'no-such-rule'"),
        (("--user", "x" * 300), 2, "--user: String should have at most 256 characters"),
        (("--user", ""), 2, "--user: String should have at least 1 character"),
        (("--rule", "a\nb"), 2, "--rule: must be plain text"),
    ],
)
def test_cli_reset_refusals_name_the_flag(
    daemon: Daemon, args: tuple[str, ...], code: int, says: str
) -> None:
    done = run_cli("reset", "--url", daemon.url, "--token", ADMIN, *args)
    assert done.returncode == code, (done.stdout, done.stderr)
    assert says in done.stderr
    assert done.stdout == ""


def test_cli_reset_with_a_check_token_is_refused(daemon: Daemon) -> None:
    done = run_cli("reset", "--url", daemon.url, "--token", CHECK, "--user", "x")
    assert done.returncode == 2
    assert "admin token" in done.stderr


def test_cli_reset_of_an_unreachable_daemon_exits_4(tmp_path: Path) -> None:
    done = run_cli("reset", "--url", "http://127.0.0.1:9", "--token", ADMIN, "--user", "x")
    assert done.returncode == 4
    assert "unreachable" in done.stderr


def at_terminal(daemon: Daemon, answer: str, *args: str) -> tuple[int, str]:
    """`ratewarden reset ARGS` with a terminal as its stdin, typing `answer` at its prompt."""
    pid, terminal = pty.fork()
    if pid == 0:  # the child: its stdin, stdout and stderr are the terminal
        env = clean_environment(RATEWARDEN_TOKEN=ADMIN)
        os.execve(
            sys.executable,
            [sys.executable, "-m", "ratewarden", "reset", "--url", daemon.url, *args],
            env,
        )
    shown = b""
    while b"[y/N]" not in shown:
        shown += os.read(terminal, 1024)
    os.write(terminal, answer.encode() + b"\n")
    while True:
        try:
            chunk = os.read(terminal, 1024)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), shown.decode()


def test_cli_reset_asks_first_at_a_terminal_naming_the_amount(daemon: Daemon) -> None:
    spend_on(daemon, "frank")
    code, shown = at_terminal(daemon, "n", "--user", "frank", "--rule", "daily-spend")
    assert "Forget 1.20 USD spent (+0.50 reserved) by frank on daily-spend?" in shown
    assert code == 1
    assert "not reset" in shown
    assert used_on(daemon, "frank")["daily-spend"] == (1.2, 0.5)  # nothing forgotten
    assert audited_in_log(daemon, "frank", within_s=0.5) == []

    code, shown = at_terminal(daemon, "y", "--user", "frank", "--rule", "daily-spend")
    assert code == 0, shown
    assert used_on(daemon, "frank")["daily-spend"] == (0.0, 0.0)

    spend_on(daemon, "gina")  # --yes: no question, at a terminal too
    pid, terminal = pty.fork()
    if pid == 0:
        env = clean_environment(RATEWARDEN_TOKEN=ADMIN)
        argv = ["-m", "ratewarden", "reset", "--url", daemon.url, "--user", "gina", "--yes"]
        os.execve(sys.executable, [sys.executable, *argv], env)
    _, status = os.waitpid(pid, 0)
    os.close(terminal)
    assert os.waitstatus_to_exitcode(status) == 0
    assert used_on(daemon, "gina")["daily-spend"] == (0.0, 0.0)


@pytest.mark.slow
def test_resets_through_any_worker_are_counted_once_each(tmp_path: Path) -> None:
    """With `--workers 2`, whichever worker takes a reset, /metrics (merged across the
    workers) counts every one of them, and each is audited once."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    env = clean_environment(RATEWARDEN_ADMIN_TOKENS=ADMIN, RATEWARDEN_API_TOKENS=CHECK)
    with (
        running_redis(tmp_path / "redis") as redis_server,
        running_daemon(
            tmp_path,
            "--store-url",
            redis_server.url,
            "--policy",
            str(policy),
            "--workers",
            "2",
            env=env,
        ) as workers,
    ):
        for n in range(6):  # a new connection each: either worker may take it
            done = run_cli("reset", "--url", workers.url, "--token", ADMIN, "--user", f"u{n}")
            assert done.returncode == 0, done.stderr
        with httpx.Client(base_url=workers.url, trust_env=False, timeout=5) as http:
            metrics = http.get("/metrics").text
        assert 'ratewarden_resets_total{target="user"} 6.0' in metrics
        audited = [audited_in_log(workers, f"u{n}") for n in range(6)]
        assert [len(lines) for lines in audited] == [1] * 6
