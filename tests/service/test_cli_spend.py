"""`ratewarden spend` through the real CLI against a real daemon on a real redis-server:
one line per day, rule and scope and a total; `--csv` and `--json` print the daemon's
answers; a bad flag names itself (exit 2); a check token is refused with the variable to
set (exit 2); an unreachable daemon is exit 4. Concurrent settles from several processes:
the day's record equals the budget's spent, exactly (tests/stores/test_spend_race_redis.py).
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import httpx
import pytest

from tests.helpers.daemon import Daemon, clean_environment, run_cli, running_daemon
from tests.helpers.redis_server import running_redis

pytestmark = pytest.mark.redis

ADMIN, VIEWER, CHECK = "adm-" + "a" * 20, "view-" + "v" * 20, "chk-" + "c" * 20
POLICY = """\
version: 1
defaults: {timezone: UTC}
models:
  "house-*": {input: 2, output: 8}
rules:
  - {name: daily-spend, per: [user], budget: 50.00/day, currency: USD}
  - {name: team-spend, per: [team], budget: 500.00/day, currency: EUR}
  - {name: all-spend, match: {kind: any, user: carol}, per: [user], budget: 50.00/day}
"""


def ratewarden(*args: str, token: str | None = VIEWER, url: str | None = None) -> Any:
    env = clean_environment(**({"RATEWARDEN_TOKEN": token} if token else {}))
    if url:
        env["RATEWARDEN_URL"] = url
    return run_cli(*args, env=env)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Any:
    directory = tmp_path_factory.mktemp("spend")
    policy = directory / "policy.yaml"
    policy.write_text(POLICY)
    env = clean_environment(
        RATEWARDEN_ADMIN_TOKENS=ADMIN,
        RATEWARDEN_VIEWER_TOKENS=VIEWER,
        RATEWARDEN_API_TOKENS=CHECK,
    )
    with (
        running_redis(directory / "redis") as redis_server,
        running_daemon(
            directory, "--store-url", redis_server.url, "--policy", str(policy), env=env
        ) as serving,
    ):
        spend(serving, [("alice", "red", 1.5, 1.25), ("bob", "red", 0.5, None)])
        spend(serving, [("=cmd|' /C calc'!A0", "blue", 0.1, None)])
        spend(serving, [("carol", "green", 0.5, 0.25)])
        spend_on_a_model(serving, "carol")
        yield serving


def spend(daemon: Daemon, calls: list[tuple[str, str, float, float | None]]) -> None:
    headers = {"Authorization": f"Bearer {CHECK}"}
    with httpx.Client(base_url=daemon.url, trust_env=False, timeout=5, headers=headers) as http:
        for user, team, estimate, actual in calls:
            body = {"user": user, "team": team, "tool": "t", "cost": estimate}
            answer = http.post("/v1/check", json=body).json()
            assert answer["allowed"], answer
            settle = {} if actual is None else {"cost": actual}
            found = http.post(f"/v1/calls/{answer['call_id']}/settle", json=settle)
            assert found.status_code == 200, found.text


def spend_on_a_model(daemon: Daemon, user: str) -> None:
    """One model call, settled with its usage: 1000 in at 2, 500 out at 8 = 0.006 USD."""
    headers = {"Authorization": f"Bearer {CHECK}"}
    with httpx.Client(base_url=daemon.url, trust_env=False, timeout=5, headers=headers) as http:
        body = {"user": user, "kind": "model", "model": "house-7b", "input_tokens": 1000,
                "max_output_tokens": 1000}  # fmt: skip
        answer = http.post("/v1/check", json=body).json()
        assert answer["allowed"], answer
        usage = {"input_tokens": 1000, "output_tokens": 500}
        found = http.post(f"/v1/calls/{answer['call_id']}/settle", json={"usage": usage})
        assert found.status_code == 200, found.text


def test_each_row_says_what_model_calls_spent_of_it(daemon: Daemon) -> None:
    done = ratewarden("spend", "--user", "carol", "--rule", "all-spend", "--url", daemon.url)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].split() == ["DAY", "RULE", "SCOPE", "AMOUNT", "MODELS"]
    [row] = lines[2:-1]
    assert row.split()[1:] == ["all-spend", "user=carol", "0.26", "USD", "0.01", "USD"]
    as_json = ratewarden("spend", "--json", "--user", "carol", "--rule", "all-spend",
                         "--url", daemon.url)  # fmt: skip
    [found] = json.loads(as_json.stdout)["rows"]
    assert (found["amount"], found["model"]) == (0.256, 0.006)


def test_one_line_per_day_and_rule_and_a_total(daemon: Daemon) -> None:
    done = ratewarden("spend", "--user", "alice", "--since", "7d", "--url", daemon.url)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("spend ")
    assert lines[0].endswith("(UTC days)")
    assert lines[1].split() == ["DAY", "RULE", "SCOPE", "AMOUNT", "MODELS"]
    [row] = lines[2:-1]
    assert row.split()[1:] == ["daily-spend", "user=alice", "1.25", "USD", "0.00", "USD"]
    assert lines[-1] == "total: 1.25 USD"
    team = ratewarden("spend", "--team", "red", "--url", daemon.url)
    assert team.stdout.splitlines()[-1] == "total: 1.75 EUR", team.stdout


def test_csv_and_json_are_the_daemons_answers(daemon: Daemon) -> None:
    done = ratewarden("spend", "--csv", "--url", daemon.url)
    assert done.returncode == 0, done.stderr
    table = list(csv.reader(io.StringIO(done.stdout)))
    assert table[0] == ["day", "rule", "user", "team", "scope", "amount", "currency", "model"]
    users = {row[2] for row in table[1:] if row[1] == "daily-spend"}
    assert users == {"alice", "bob", "carol", "'=cmd|' /C calc'!A0"}  # no formula for a spreadsheet
    as_json = ratewarden("spend", "--json", "--rule", "team-spend", "--url", daemon.url)
    answer = json.loads(as_json.stdout)
    assert sorted((r["scope"]["team"], r["amount"]) for r in answer["rows"]) == [
        ("blue", 0.1),
        ("green", 0.25),
        ("red", 1.75),
    ]


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--since=-7d"], "--since"),
        (["--since", "garbage"], "--since"),
        (["--since", "99999d"], "--since"),
        (["--until", "2023-02-30"], "--until"),
        (["--since", "2026-01-02", "--until", "2026-01-01"], "--since"),
        (["--csv", "--json"], "--csv and --json"),
    ],
)
def test_a_bad_flag_names_itself(daemon: Daemon, flags: list[str], named: str) -> None:
    done = ratewarden("spend", *flags, "--url", daemon.url)
    assert done.returncode == 2
    assert done.stderr.startswith(f"ratewarden: {named}"), done.stderr


def test_a_check_token_is_refused_and_told_what_to_set(daemon: Daemon) -> None:
    done = ratewarden("spend", "--url", daemon.url, token=CHECK)
    assert done.returncode == 2
    assert "set RATEWARDEN_TOKEN (or pass --token TOKEN)" in done.stderr
    none = ratewarden("spend", "--url", daemon.url, token=None)
    assert none.returncode == 2
    assert "needs a token: set RATEWARDEN_TOKEN" in none.stderr


def test_an_unreachable_daemon_is_exit_4() -> None:
    done = ratewarden("spend", "--url", "http://127.0.0.1:9", "--timeout", "0.5")
    assert done.returncode == 4
    assert "unreachable" in done.stderr
