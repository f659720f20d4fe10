"""Runtime overrides (issue 20, item 1): set, listed, removed and expired through the admin
API; applied by the daemon that took them at once and by its peers on the same Redis
within the poll; kept across a restart; refused with a 422 naming the field; audited and
counted; admin only."""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import json
import logging
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ratewarden.clock import FakeClock
from ratewarden.store import MemoryStore
from ratewarden.store.snapshot import StateFile
from tests.helpers.app import assert_error_shape, build_app, serving
from tests.helpers.daemon import RATEWARDEN, clean_environment, running_daemon
from tests.helpers.redis_server import running_redis

ADMIN, CHECK = "admin-token-0123456789", "check-token-0123456789"
AS_ADMIN = {"Authorization": f"Bearer {ADMIN}"}
AS_CHECK = {"Authorization": f"Bearer {CHECK}"}
POLICY = """\
version: 1
groups:
  pro: [carol]
rules:
  - name: terminal-per-minute
    match: {tool: terminal}
    per: [user]
    rate: 2/minute
  - name: daily-spend
    match: {tool: browser}
    per: [user]
    budget: 1/day
overrides:
  - users: [dave]
    rule: terminal-per-minute
    rate: 5/minute
"""
GRANT = {"users": ["alice"], "rule": "terminal-per-minute", "rate": "20/minute",
         "ttl": "10m", "reason": "support ticket 4411"}  # fmt: skip


def make_app(clock: FakeClock | None = None, store: MemoryStore | None = None) -> Any:
    clock = clock or FakeClock()
    return build_app(
        POLICY,
        store or MemoryStore(clock),
        api_tokens=[CHECK],
        admin_tokens=[ADMIN],
        admin_names=["ops-ana"],
    )


async def allowed(client: httpx.AsyncClient, user: str, times: int) -> list[bool]:
    answers = []
    for _ in range(times):
        found = await client.post(
            "/v1/check", json={"user": user, "tool": "terminal"}, headers=AS_CHECK
        )
        answers.append(found.json()["allowed"])
    return answers


async def test_an_override_lifts_one_users_limit_now_and_its_removal_restores_it() -> None:
    async with serving(make_app()) as client:
        assert await allowed(client, "alice", 3) == [True, True, False]
        made = await client.post("/v1/admin/overrides", json=GRANT, headers=AS_ADMIN)
        assert made.status_code == 201, made.text
        override = made.json()
        assert override["set_by"] == "ops-ana"  # the admin token's configured name
        assert override["reason"] == "support ticket 4411"
        assert override["expires_at"] is not None
        assert await allowed(client, "alice", 5) == [True] * 5  # 20/minute now
        assert await allowed(client, "bob", 3) == [True, True, False]  # nobody else

        listed = (await client.get("/v1/admin/overrides", headers=AS_ADMIN)).json()
        assert [o["id"] for o in listed["overrides"]] == [override["id"]]
        assert listed["overrides"][0]["active"] is True
        assert listed["version"] >= 1

        gone = await client.delete(f"/v1/admin/overrides/{override['id']}", headers=AS_ADMIN)
        assert gone.json() == {"id": override["id"], "removed": True}
        assert (await client.get("/v1/admin/overrides", headers=AS_ADMIN)).json()["overrides"] == []
        assert await allowed(client, "alice", 1) == [False]  # 2/minute again
        again = await client.delete(f"/v1/admin/overrides/{override['id']}", headers=AS_ADMIN)
        assert again.status_code == 404
        assert again.json()["fields"][0]["field"] == "override_id"


async def test_an_override_expires_at_its_ttl() -> None:
    clock = FakeClock()
    app = make_app(clock)
    async with serving(app) as client:
        await client.post("/v1/admin/overrides", json=GRANT, headers=AS_ADMIN)
        assert await allowed(client, "alice", 4) == [True] * 4
        clock.advance(11 * 60 * 1000)
        await app.state.overrides.refresh()  # what the poller does every second
        assert (await client.get("/v1/admin/overrides", headers=AS_ADMIN)).json()["overrides"] == []
        assert await allowed(client, "alice", 3) == [True, True, False]


async def test_a_runtime_override_beats_the_files_for_the_same_user_only() -> None:
    async with serving(make_app()) as client:
        usage = await client.get("/v1/usage", params={"user": "dave"}, headers=AS_CHECK)
        limit = {i["rule"]: i["limit"] for i in usage.json()["limits"]}
        assert limit["terminal-per-minute"] == 5  # the file's override
        lower = {**GRANT, "users": ["dave"], "rate": "3/minute"}
        assert (
            await client.post("/v1/admin/overrides", json=lower, headers=AS_ADMIN)
        ).status_code == 201
        usage = await client.get("/v1/usage", params={"user": "dave"}, headers=AS_CHECK)
        assert {i["rule"]: i["limit"] for i in usage.json()["limits"]}["terminal-per-minute"] == 3
        # A runtime override for a group does not beat the file's for one of its users.
        group = {**GRANT, "users": None, "groups": ["pro"], "rate": "9/minute"}
        del group["users"]
        assert (
            await client.post("/v1/admin/overrides", json=group, headers=AS_ADMIN)
        ).status_code == 201
        usage = await client.get("/v1/usage", params={"user": "carol"}, headers=AS_CHECK)
        assert {i["rule"]: i["limit"] for i in usage.json()["limits"]}["terminal-per-minute"] == 9


async def test_the_newest_runtime_override_for_a_user_wins() -> None:
    clock = FakeClock()
    async with serving(make_app(clock)) as client:
        await client.post("/v1/admin/overrides", json=GRANT, headers=AS_ADMIN)
        clock.advance(1)
        later = {**GRANT, "rate": "7/minute"}
        await client.post("/v1/admin/overrides", json=later, headers=AS_ADMIN)
        usage = await client.get("/v1/usage", params={"user": "alice"}, headers=AS_CHECK)
        assert {i["rule"]: i["limit"] for i in usage.json()["limits"]}["terminal-per-minute"] == 7


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"reason": None}, "reason"),
        ({"reason": ""}, "reason"),
        ({"reason": "x" * 501}, "reason"),
        ({"reason": "line\nbreak"}, "reason"),
        ({"reason": "ok\u202egnp.exe"}, "reason"),  # a right-to-left override
        ({"reason": "two\u2028lines"}, "reason"),  # a line separator
        ({"rule": "no-such-rule"}, "rule"),
        ({"rate": None, "budget": "5/day"}, "budget"),  # a rate rule
        ({"rate": "lots"}, "rate"),
        ({"rate": "200000/minute"}, "rate"),  # above the rule's own cap
        ({"rate": None, "concurrency": -1}, "concurrency"),
        ({"rate": None, "concurrency": "3"}, "concurrency"),
        ({"users": None, "groups": ["nobody-knows"]}, "groups"),
        ({"users": None}, "users"),
        ({"users": []}, "users"),
        ({"users": ["a"] * 101}, "users"),
        ({"rate": None}, "rate"),
        ({"unlimited": True}, "unlimited"),  # with a rate too
        ({"unlimited": "yes", "rate": None}, "unlimited"),
        ({"until": "2030-01-01T00:00:00Z"}, "ttl"),  # both
        ({"ttl": None, "until": "2000-01-01T00:00:00Z"}, "until"),
        ({"ttl": None, "until": "2030-01-01T00:00:00"}, "until"),  # no time zone
        ({"ttl": "forever"}, "ttl"),
        ({"ttl": "400d"}, "ttl"),
        ({"mode": "shadow"}, "mode"),
    ],
)
@pytest.mark.slow
async def test_a_bad_override_is_refused_naming_the_field(
    change: dict[str, Any], field: str
) -> None:
    body = {k: v for k, v in {**GRANT, **change}.items() if v is not None}
    async with serving(make_app()) as client:
        refused = await client.post("/v1/admin/overrides", json=body, headers=AS_ADMIN)
        assert refused.status_code == 422, refused.text
        found = refused.json()
        assert_error_shape(found)
        assert any(field in entry["field"] for entry in found["fields"]), found
        assert (await client.get("/v1/admin/overrides", headers=AS_ADMIN)).json()["overrides"] == []


async def test_overrides_are_for_admins_only() -> None:
    async with serving(make_app()) as client:
        assert (
            await client.post("/v1/admin/overrides", json=GRANT, headers=AS_CHECK)
        ).status_code == 403
        assert (await client.get("/v1/admin/overrides", headers=AS_CHECK)).status_code == 403
        assert (
            await client.delete("/v1/admin/overrides/ovr_1", headers=AS_CHECK)
        ).status_code == 403
        assert (await client.post("/v1/admin/overrides", json=GRANT)).status_code == 401


async def test_a_change_is_audited_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ratewarden.audit")
    async with serving(make_app()) as client:
        made = (await client.post("/v1/admin/overrides", json=GRANT, headers=AS_ADMIN)).json()
        await client.delete(f"/v1/admin/overrides/{made['id']}", headers=AS_ADMIN)
        metrics = (await client.get("/metrics")).text
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "ratewarden.audit"]
    set_line, removed = [line for line in lines if line["event"].startswith("override")]
    assert set_line["event"] == "override_set"
    assert set_line["id"] == made["id"]
    assert set_line["by"] == "ops-ana"
    assert set_line["reason"] == "support ticket 4411"
    assert set_line["users"] == ["alice"]
    assert removed == {"event": "override_removed", "id": made["id"], "by": "ops-ana",
                       "at": removed["at"]}  # fmt: skip
    assert 'ratewarden_override_changes_total{action="set"} 1.0' in metrics
    assert 'ratewarden_override_changes_total{action="remove"} 1.0' in metrics


async def test_overrides_are_kept_across_a_restart_in_the_state_file(tmp_path: Path) -> None:
    clock = FakeClock()
    path = tmp_path / "state.json"
    store = MemoryStore(clock, StateFile(path, 3600))
    async with serving(make_app(clock, store)) as client:
        made = (await client.post("/v1/admin/overrides", json=GRANT, headers=AS_ADMIN)).json()
    again = MemoryStore(clock, StateFile(path, 3600))
    async with serving(make_app(clock, again)) as client:
        listed = (await client.get("/v1/admin/overrides", headers=AS_ADMIN)).json()["overrides"]
        assert [o["id"] for o in listed] == [made["id"]]
        assert await allowed(client, "alice", 4) == [True] * 4


async def test_an_override_whose_rule_left_the_policy_is_listed_idle(tmp_path: Path) -> None:
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(POLICY)
    clock = FakeClock()
    app = build_app(
        POLICY, MemoryStore(clock), api_tokens=[CHECK], admin_tokens=[ADMIN],
        policy=policy_file, reload_interval_s=0,
    )  # fmt: skip
    async with serving(app) as client:
        await client.post("/v1/admin/overrides", json=GRANT, headers=AS_ADMIN)
        reloaded = POLICY.replace("terminal-per-minute", "shell-per-minute")
        outcome = await app.state.reloader.reload("test", raw=reloaded.encode())
        assert outcome.ok  # the file is never refused for a runtime override
        listed = (await client.get("/v1/admin/overrides", headers=AS_ADMIN)).json()["overrides"]
        assert listed[0]["active"] is False
        assert "no rule 'terminal-per-minute'" in listed[0]["idle"]
        outcome = await app.state.reloader.reload("test", raw=POLICY.encode())  # it is back
        listed = (await client.get("/v1/admin/overrides", headers=AS_ADMIN)).json()["overrides"]
        assert listed[0]["active"] is True
        assert await allowed(client, "alice", 4) == [True] * 4


# -- two daemons on one real Redis -----------------------------------------------------------


@contextlib.contextmanager
def two_daemons(tmp_path: Path) -> Iterator[tuple[str, str, Any]]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    env = clean_environment(
        RATEWARDEN_API_TOKENS=CHECK, RATEWARDEN_ADMIN_TOKENS=ADMIN, RATEWARDEN_ADMIN_NAMES="ops-ana"
    )
    with running_redis(tmp_path) as redis:
        flags = ("--policy", str(policy), "--store-url", redis.url)
        with (
            running_daemon(tmp_path, *flags, env=env) as one,
            running_daemon(tmp_path, *flags, env=env) as two,
        ):
            yield one.url, two.url, redis


def limit_of(url: str, user: str) -> Any:
    found = httpx.get(f"{url}/v1/usage", params={"user": user}, headers=AS_CHECK, trust_env=False)
    return {i["rule"]: i["limit"] for i in found.json()["limits"]}["terminal-per-minute"]


@pytest.mark.redis
@pytest.mark.slow
def test_every_daemon_on_the_store_applies_a_change_within_the_poll(tmp_path: Path) -> None:
    with two_daemons(tmp_path) as (one, two, _):
        assert limit_of(two, "alice") == 2
        made = httpx.post(
            f"{one}/v1/admin/overrides", json=GRANT, headers=AS_ADMIN, trust_env=False
        )
        assert made.status_code == 201
        assert limit_of(one, "alice") == 20  # the daemon that took it: before it answered
        changed = time.monotonic()
        while limit_of(two, "alice") != 20:  # its peer: at its next poll (every second)
            assert time.monotonic() - changed < 10, "the peer never applied the override"
            time.sleep(0.05)
        listed = httpx.get(f"{two}/v1/admin/overrides", headers=AS_ADMIN, trust_env=False).json()
        assert listed["overrides"][0]["set_by"] == "ops-ana"
        httpx.delete(
            f"{two}/v1/admin/overrides/{made.json()['id']}", headers=AS_ADMIN, trust_env=False
        )
        while limit_of(one, "alice") != 2:
            assert time.monotonic() - changed < 20, "the removal never reached the first daemon"
            time.sleep(0.05)


# -- the command line ---------------------------------------------------------------------------


def cli(url: str, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = clean_environment(RATEWARDEN_URL=url, RATEWARDEN_TOKEN=token)
    return subprocess.run(
        [*RATEWARDEN, "override", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


@pytest.mark.slow
def test_the_cli_sets_lists_and_removes_an_override(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    env = clean_environment(
        RATEWARDEN_API_TOKENS=CHECK, RATEWARDEN_ADMIN_TOKENS=ADMIN, RATEWARDEN_ADMIN_NAMES="ops-ana"
    )
    with running_daemon(tmp_path, "--policy", str(policy), env=env) as daemon:
        made = cli(daemon.url, ADMIN, "set", "--user", "alice", "--rule", "terminal-per-minute",
                   "--rate", "20/minute", "--ttl", "10m", "--reason", "ticket 4411")  # fmt: skip
        assert made.returncode == 0, made.stderr
        override_id = made.stdout.split()[1]
        assert "alice: terminal-per-minute rate 20/minute until" in made.stdout
        assert "by ops-ana (ticket 4411)" in made.stdout
        assert limit_of(daemon.url, "alice") == 20

        listed = cli(daemon.url, ADMIN, "list")
        assert listed.stdout.startswith(override_id)
        as_json = json.loads(cli(daemon.url, ADMIN, "list", "--json").stdout)
        assert as_json["overrides"][0]["reason"] == "ticket 4411"

        wrong = cli(daemon.url, ADMIN, "set", "--user", "bob", "--rule", "terminal-per-minute",
                    "--rate", "lots", "--reason", "x")  # fmt: skip
        assert wrong.returncode == 2
        assert "rate" in wrong.stderr
        not_admin = cli(daemon.url, CHECK, "list")
        assert not_admin.returncode == 2
        assert "admin token" in not_admin.stderr

        removed = cli(daemon.url, ADMIN, "rm", override_id)
        assert removed.returncode == 0, removed.stderr
        assert cli(daemon.url, ADMIN, "list").stdout.strip() == "(no runtime overrides)"
        assert cli(daemon.url, ADMIN, "rm", override_id).returncode == 2  # gone already
    gone = cli(daemon.url, ADMIN, "list")
    assert gone.returncode == 4
    assert "unreachable" in gone.stderr


def test_the_cli_refuses_a_bad_expiry_before_asking(tmp_path: Path) -> None:
    refused = cli("http://127.0.0.1:9", ADMIN, "set", "--user", "a", "--rule", "r",
                  "--rate", "1/minute", "--until", "tomorrow", "--reason", "x")  # fmt: skip
    assert refused.returncode == 2
    assert "--until" in refused.stderr


def redis_commands(redis: Any, name: str) -> int:
    stats = redis.client().info("commandstats")
    return int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))


@pytest.mark.redis
@pytest.mark.slow
def test_a_decision_reads_nothing_of_the_overrides(tmp_path: Path) -> None:
    """The version is read by each daemon's poller once a second, never per call: 300
    checks cost no more GETs than the seconds they took, on each daemon."""
    with two_daemons(tmp_path) as (one, _, redis):
        httpx.post(f"{one}/v1/admin/overrides", json=GRANT, headers=AS_ADMIN, trust_env=False)
        gets, started = redis_commands(redis, "get"), time.monotonic()
        with httpx.Client(base_url=one, headers=AS_CHECK, trust_env=False) as client:
            for n in range(300):
                client.post("/v1/check", json={"user": f"u{n % 7}", "tool": "terminal"})
        seconds = time.monotonic() - started
        polls = 2 * (int(seconds) + 2)  # two daemons, each at most once a second (+ edges)
        assert redis_commands(redis, "get") - gets <= polls


# -- names an admin sets are plain text; what the CLI prints is escaped (issue 25, item 11) --

UNREADABLE = ["\x1b[31mroot", "a\x00b", "a\u2028b", "a\x7fb", "ok\u202egnp", "a\u200fb"]


@pytest.mark.parametrize("name", UNREADABLE)
@pytest.mark.parametrize("field", ["users", "groups", "rule"])
@pytest.mark.slow
async def test_a_name_with_a_control_character_is_refused_naming_its_field(
    field: str, name: str
) -> None:
    change = {"rule": f"terminal-per-minute{name}"} if field == "rule" else {field: [name]}
    body = {**GRANT, **change}
    async with serving(make_app()) as client:
        refused = await client.post("/v1/admin/overrides", json=body, headers=AS_ADMIN)
        assert refused.status_code == 422, refused.text
        (entry,) = refused.json()["fields"]
        assert field in entry["field"]
        assert "plain text" in entry["message"], entry  # not "unknown group", not a pattern


@pytest.mark.parametrize("name", UNREADABLE)
async def test_a_reset_of_a_rule_with_a_control_character_is_refused(name: str) -> None:
    """A reset's rule is a name of the file: plain text. Its user is any name the check
    API took (tests/service/test_hostile_input.py resets such names), so it is not."""
    async with serving(make_app()) as client:
        refused = await client.post("/v1/admin/reset", json={"rule": name}, headers=AS_ADMIN)
        assert refused.status_code == 422, refused.text
        (entry,) = refused.json()["fields"]
        assert entry["field"] == "rule"
        assert "plain text" in entry["message"]  # not an unknown rule
        done = await client.post("/v1/admin/reset", json={"user": name}, headers=AS_ADMIN)
        assert done.status_code == 200, done.text


@pytest.mark.parametrize("name", UNREADABLE)
def test_a_policy_file_naming_a_user_or_group_with_a_control_character_is_refused(
    name: str,
) -> None:
    from ratewarden.policy import PolicyError, parse_policy

    quoted = json.dumps(name)  # a YAML double-quoted scalar reads JSON's escapes
    for text in (
        POLICY.replace("pro: [carol]", f"pro: [{quoted}]"),
        POLICY.replace("pro: [carol]", f"{quoted}: [carol]"),
        POLICY.replace("users: [dave]", f"users: [{quoted}]"),
    ):
        with pytest.raises(PolicyError, match="plain text"):
            parse_policy(text.encode())


@pytest.mark.redis
@pytest.mark.slow
def test_the_cli_escapes_names_stored_before_they_were_checked(tmp_path: Path) -> None:
    """An older daemon took any name: `override list` prints what such a store holds with
    its control characters escaped, and the daemon lists such an override idle, not in
    force (the file's rules refuse the name now)."""
    user = "\x1b[2J\x1b[31mroot\u202e"
    documents = [
        {"id": "ovr_0123456789ab", "users": [user], "rule": "terminal-per-minute",
         "rate": "9/minute", "reason": "set\x1b[8m hidden", "set_by": "ops\u2028ana",
         "set_at": "2026-11-25T02:12:00Z"},
        {"id": "ovr_0123456789ac", "users": ["bob"], "rule": "x\x1b]0;pwned\x07",
         "rate": "9/minute", "reason": "r", "set_by": "ops", "set_at": "2026-11-25T02:12:00Z"},
    ]  # fmt: skip
    with two_daemons(tmp_path) as (one, _, redis):
        client = redis.client()
        for document in documents:
            client.hset("rw:admin:{overrides}", document["id"], json.dumps(document))
        client.incr("rw:admin:{overrides}:version")
        listed = cli(one, ADMIN, "list")
        assert listed.returncode == 0, listed.stderr
        assert all(c.isprintable() or c == "\n" for c in listed.stdout), listed.stdout
        assert "\\x1b[2J\\x1b[31mroot\\u202e: terminal-per-minute" in listed.stdout
        assert "by ops\\u2028ana (set\\x1b[8m hidden) [idle: users" in listed.stdout
        assert "bob: x\\x1b]0;pwned\\x07 rate" in listed.stdout
        assert limit_of(one, user) == 2  # not applied


# -- a change costs what it changes; the cap holds under races (issue 25, item 9) ------------

MAX = 1000  # service/overrides.py MAX_OVERRIDES


def glob_grant(n: int, expires: str | None = None, users: int = 100) -> str:
    """The stored document of an override of 100 glob users (the most an override names)."""
    return json.dumps({
        "id": f"ovr_seed{n:08x}", "users": [f"team-{n}-{k}-*" for k in range(users)],
        "set_at": "2026-11-25T02:12:00Z",
        "rule": "terminal-per-minute", "rate": "9/minute", "reason": "seeded",
        "set_by": "ops", "expires_at": expires,
    })  # fmt: skip


def seed(store: MemoryStore, documents: dict[str, str]) -> None:
    """Stored as an older daemon would have: straight into the store, one version later."""
    store._overrides.update(documents)
    store._overrides_version += 1


@contextlib.contextmanager
def counting_globs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every glob user of an override compiled meanwhile: the costly step of compiling
    overrides (policy/compile.py; cfe3e0b compiled them through NameSet.of, so on it this
    counts none while the test's timeout catches it). Each must be compiled off the event
    loop, so that checks go on meanwhile."""
    from ratewarden.policy import compile as compiler
    from ratewarden.policy import model

    compile_glob = getattr(model, "compile_glob", lambda p: re.compile(fnmatch.translate(p)))
    compiled: list[str] = []
    loop = threading.get_ident()  # the test's event loop runs the daemon's too

    def counted(pattern: str) -> Any:
        assert threading.get_ident() != loop, "compiled on the event loop: checks would wait"
        compiled.append(pattern)
        return compile_glob(pattern)

    with monkeypatch.context() as patched:
        patched.setattr(compiler, "compile_glob", counted, raising=False)
        yield compiled


GLOB_GRANT = {**GRANT, "users": [f"new-{k}-*" for k in range(100)]}


async def test_a_change_at_the_cap_compiles_only_what_it_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """999 overrides of 100 glob users each are in force (99 900 globs). Setting one more
    compiles its 100 globs once on the daemon that took it and once on a peer; removing
    one compiles nothing; and the 1 001st is refused, compiling only its own. (cfe3e0b
    compiled every override twice on the daemon that took it, once on each peer.)"""
    clock = FakeClock()
    store = MemoryStore(clock)
    seed(store, {f"ovr_seed{n:08x}": glob_grant(n) for n in range(MAX - 1)})
    one, peer = make_app(clock, store), make_app(clock, store)
    async with serving(one) as client, serving(peer):
        with counting_globs(monkeypatch) as compiled:
            made = await client.post("/v1/admin/overrides", json=GLOB_GRANT, headers=AS_ADMIN)
            assert made.status_code == 201, made.text
            assert len(compiled) == 100  # its own globs, once: its trial is what is applied
        with counting_globs(monkeypatch) as compiled:
            assert await peer.state.overrides.refresh()  # the peer's next poll
            assert sorted(compiled) == sorted(GLOB_GRANT["users"])
        with counting_globs(monkeypatch) as compiled:
            full = await client.post("/v1/admin/overrides", json=GLOB_GRANT, headers=AS_ADMIN)
            assert full.status_code == 422, full.text
            assert full.json()["fields"][0]["field"] == "overrides"
            assert len(compiled) <= 100
        with counting_globs(monkeypatch) as compiled:
            gone = await client.delete(f"/v1/admin/overrides/{made.json()['id']}",
                                       headers=AS_ADMIN)  # fmt: skip
            assert gone.status_code == 200
            assert await peer.state.overrides.refresh()
            assert compiled == []
        # And the merged policy is the one a whole compile gives: precedence kept.
        usage = await client.get("/v1/usage", params={"user": "team-5-7-x"}, headers=AS_CHECK)
        assert {i["rule"]: i["limit"] for i in usage.json()["limits"]}["terminal-per-minute"] == 9
        assert await allowed(client, "new-1-x", 3) == [True, True, False]  # removed


async def test_the_cap_holds_when_sets_race_on_two_daemons_of_one_store() -> None:
    """At 997 stored, ten sets at once over two daemons of one store: three are stored,
    seven refused naming `overrides` (cfe3e0b counted before writing, and stored 1 007)."""
    clock = FakeClock()
    store = MemoryStore(clock)
    seed(store, {f"ovr_seed{n:08x}": glob_grant(n, users=1) for n in range(MAX - 3)})
    one, two = make_app(clock, store), make_app(clock, store)
    async with serving(one) as first, serving(two) as second:
        answers = await asyncio.gather(*(
            client.post("/v1/admin/overrides", json={**GRANT, "users": [f"u{n}"]},
                        headers=AS_ADMIN)
            for n, client in enumerate([first, second] * 5)
        ))  # fmt: skip
        codes = sorted(a.status_code for a in answers)
        assert codes == [201] * 3 + [422] * 7, [a.text for a in answers]
        assert {a.json()["fields"][0]["field"] for a in answers if a.status_code == 422} == {
            "overrides"
        }
        assert len(store._overrides) == MAX


async def test_an_expired_override_makes_room_under_the_cap() -> None:
    """The cap counts what the store holds: a set at the cap drops the expired ones in the
    same step (cfe3e0b never removed them, so they stayed stored past the cap)."""
    clock = FakeClock()  # in 2023: the seeded one expired in 2000
    store = MemoryStore(clock)
    documents = {f"ovr_seed{n:08x}": glob_grant(n, users=1) for n in range(MAX - 1)}
    documents["ovr_seed_expired"] = glob_grant(MAX, expires="2000-01-01T00:00:00Z", users=1)
    seed(store, documents)
    async with serving(make_app(clock, store)) as client:
        made = await client.post("/v1/admin/overrides", json=GRANT, headers=AS_ADMIN)
        assert made.status_code == 201, made.text
        assert "ovr_seed_expired" not in store._overrides
        assert len(store._overrides) == MAX


def post_at_barrier(urls: list[str], barrier: Any, results: Any, n: int) -> None:
    """One racer: waits for the others, then sets (even n) or, with `rm:` urls, removes."""
    url = urls[n % len(urls)]
    barrier.wait(timeout=60)
    if url.startswith("rm:"):
        _, base, override_id = url.split("|")
        answer = httpx.delete(f"{base}/v1/admin/overrides/{override_id}", headers=AS_ADMIN,
                              trust_env=False, timeout=30)  # fmt: skip
    else:
        body = {**GRANT, "users": [f"racer-{n}"]}
        answer = httpx.post(f"{url}/v1/admin/overrides", json=body, headers=AS_ADMIN,
                            trust_env=False, timeout=30)  # fmt: skip
    fields = answer.json().get("fields") or [{}]
    results.put((answer.status_code, fields[0].get("field")))


# Slow: the in-process race above (two daemons of one store) guards the cap in the quick loop.
@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.timeout(300)  # two daemons and twenty spawned processes: slow on a busy CI box
def test_the_cap_holds_when_processes_race_on_two_daemons_of_one_redis(tmp_path: Path) -> None:
    """At 997 stored on a real Redis, ten processes set at once through two daemons: three
    are stored and seven refused naming `overrides` (cfe3e0b stored 1 007). Then at the
    cap, five removals race five sets: the store never holds more than the cap, and what
    it holds is what the answers say."""
    from tests.helpers.races import race

    with two_daemons(tmp_path) as (one, two, redis):
        client = redis.client()
        seeded = {f"ovr_seed{n:08x}": glob_grant(n, users=1) for n in range(MAX - 3)}
        client.hset("rw:admin:{overrides}", mapping=seeded)
        client.incr("rw:admin:{overrides}:version")
        answers, exits = race(post_at_barrier, ([one, two],), 10)
        assert exits == [0] * 10
        assert sorted(answers, key=str) == [(201, None)] * 3 + [(422, "overrides")] * 7
        assert client.hlen("rw:admin:{overrides}") == MAX

        doomed = [f"rm:|{(one, two)[n % 2]}|ovr_seed{n:08x}" for n in range(5)]
        racers = [x for pair in zip(doomed, [one, two, one, two, one], strict=True)
                  for x in pair]  # fmt: skip
        answers, exits = race(post_at_barrier, (racers,), 10)
        assert exits == [0] * 10
        removed = sum(1 for code, _ in answers if code == 200)
        stored = sum(1 for code, _ in answers if code == 201)
        assert removed == 5
        assert client.hlen("rw:admin:{overrides}") == MAX - removed + stored <= MAX
        listed = httpx.get(f"{two}/v1/admin/overrides", headers=AS_ADMIN, trust_env=False)
        assert len(listed.json()["overrides"]) == MAX - removed + stored
