"""Issue 17 over HTTP: conditions on `args` and counters keyed on them, `send_args` in every
check answer and GET /v1/capabilities (with its role and after a reload), `args` kept out
of the audit line and the recent-denials list unless AUDIT_ARGS is on, and a hostile pass
(args at their caps, control characters and lone surrogates, args that are no object, a
regex against 64 KiB of text) on a policy that reads every argument it is sent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from ratewarden.clock import FakeClock
from ratewarden.policy import parse_policy
from ratewarden.service.app import create_app
from ratewarden.service.settings import Settings
from ratewarden.store import MemoryStore
from ratewarden.wire.bodies import MAX_ARGS_BYTES, MAX_ARGS_DEPTH
from tests.helpers.app import build_app, serving
from tests.service.test_hostile_input import args_of_size, nested, refused_field

CHECK_TOKEN = "chk-args-0123456789"
ADMIN_TOKEN = "adm-args-9876543210"
SECRET = "sk-args-DO-NOT-LOG-7f3a"

NO_ARGS_POLICY = """\
version: 1
groups: {staff: [alice]}
rules:
  - name: terminal-for-staff
    match: {tool: terminal}
    unless: {group: staff}
    deny: "terminal is available to staff accounts only"
  - name: calls
    rate: 100/minute
"""
# Each reads `args` in its own way: a condition, an unless, a counter per args or per one.
ARGS_POLICIES = {
    "match": "  - {name: r, match: {args: {command: {regex: 'rm'}}}, deny: refused}\n",
    "unless": "  - {name: r, unless: {args: {dry_run: true}}, rate: 100/minute}\n",
    "per-args": "  - {name: r, per: [session, tool, args], rate: 3/10 minutes}\n",
    "per-path": "  - {name: r, per: [user, args.url], rate: 100/minute}\n",
}

GUARD_POLICY = r"""
version: 1
rules:
  - name: no-root-delete
    match:
      tool: terminal
      args: {command: {regex: '\brm\s+-rf\s+/(\s|$)'}}
    deny: "Refusing destructive root delete"
  - name: no-etc
    match: {tool: read, args: {files.0: "/etc/*"}}
    deny: "{tool}: /etc is off limits"
  - name: no-force-push
    match: {tool: git, args: {"*": {contains: '"force":true'}}}
    deny: "no force push"
  - name: prod-only-by-ticket
    match: {tool: deploy, args: {env: {in: [prod]}, ticket: {exists: false}}}
    ask: "a prod deploy without a ticket needs approval"
  - name: internal-urls
    match: {tool: fetch, args: {url: {prefix: "http://10."}}}
    deny: "internal addresses are off limits"
  - name: same-call-repeats
    per: [session, tool, args]
    rate: 3/10 minutes
"""
REPEATED = (
    "Repeated call: {tool} was called with the same arguments 3 times in the last "
    "10 minutes; change the arguments or the approach"
)


@pytest.fixture(autouse=True)
def no_ratewarden_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RATEWARDEN_"):
            monkeypatch.delenv(name)


def args_policy(kind: str) -> str:
    return f"version: 1\nrules:\n{ARGS_POLICIES[kind]}"


async def check(client: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await client.post("/v1/check", json={"user": "u", "tool": "terminal", **body})
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def check_raw(client: httpx.AsyncClient, text: str) -> dict[str, Any]:
    """A check whose JSON body is sent exactly as written (key order, spacing)."""
    response = await client.post(
        "/v1/check", content=text.encode(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


# -- send_args and GET /v1/capabilities ------------------------------------------------------


@pytest.mark.parametrize("hot", [True, False], ids=["hot-path", "fastapi"])
@pytest.mark.parametrize(
    ("policy", "reads"),
    [(NO_ARGS_POLICY, False), *((args_policy(kind), True) for kind in ARGS_POLICIES)],
    ids=["no-args", *ARGS_POLICIES],
)
async def test_every_check_answer_says_whether_to_send_args(
    policy: str, reads: bool, hot: bool
) -> None:
    async with serving(build_app(policy, hot=hot)) as client:
        answers = [await check(client, user=user, args={"command": "rm"}) for user in ("a", "b")]
        answers += [await check(client, user="bob")]  # no args; refused by the no-args policy
        batch = await client.post(
            "/v1/check/batch",
            json={"calls": [{"user": "a", "tool": "t"}, {"user": "b", "tool": "t"}]},
        )
        assert batch.status_code == 200
        answers += batch.json()["results"]
        assert [a["send_args"] for a in answers] == [reads] * len(answers)
        capabilities = await client.get("/v1/capabilities")
        assert capabilities.json() == {
            "policy_version": parse_policy(policy.encode()).version,
            "send_args": reads,
        }


async def test_usage_lists_access_rules_over_http() -> None:
    async with serving(build_app(NO_ARGS_POLICY)) as client:
        usage = await client.get("/v1/usage", params={"user": "bob", "tool": "terminal"})
        assert usage.status_code == 200, usage.text
        limits = {item["rule"]: item for item in usage.json()["limits"]}
        assert list(limits) == ["terminal-for-staff", "calls"]
        access = limits["terminal-for-staff"]
        assert (access["kind"], access["limit"], access["used"], access["remaining"]) == (
            "access",
            0,
            0,
            0,
        )


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(NO_ARGS_POLICY)
    return path


def file_app(policy_file: Path, interval_s: float = 0, **values: Any) -> FastAPI:
    settings = Settings(
        store_url="memory://", policy=policy_file, reload_interval_s=interval_s, **values
    )
    return create_app(settings, store=MemoryStore(FakeClock()))


@pytest.mark.parametrize(
    ("caller", "status"),
    [(None, 401), ("Bearer nope-0123456789", 401), (f"Bearer {CHECK_TOKEN}", 200),
     (f"Bearer {ADMIN_TOKEN}", 200)],
    ids=["none", "bad", "check", "admin"],
)  # fmt: skip
async def test_capabilities_needs_the_check_role(
    policy_file: Path, caller: str | None, status: int
) -> None:
    app = file_app(policy_file, api_tokens=[CHECK_TOKEN], admin_tokens=[ADMIN_TOKEN])
    async with serving(app) as client:
        headers = {"authorization": caller} if caller else {}
        answer = await client.get("/v1/capabilities", headers=headers)
        assert answer.status_code == status, answer.text
        if status == 200:
            version = parse_policy(NO_ARGS_POLICY.encode()).version
            assert answer.json() == {"policy_version": version, "send_args": False}
        else:
            assert answer.json()["error"] == "unauthorized"


def write(path: Path, text: str) -> None:
    fresh = path.with_suffix(".tmp")
    fresh.write_text(text)
    fresh.replace(path)


async def capabilities(client: httpx.AsyncClient) -> dict[str, Any]:
    answer = await client.get("/v1/capabilities")
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


async def test_a_reload_that_adds_an_args_rule_flips_send_args(policy_file: Path) -> None:
    with_args = NO_ARGS_POLICY + ARGS_POLICIES["per-args"]
    async with serving(file_app(policy_file)) as client:
        assert (await capabilities(client))["send_args"] is False
        assert (await check(client))["send_args"] is False
        write(policy_file, with_args)
        assert (await client.post("/v1/admin/reload")).status_code == 200
        assert await capabilities(client) == {
            "policy_version": parse_policy(with_args.encode()).version,
            "send_args": True,
        }
        assert (await check(client))["send_args"] is True
        write(policy_file, NO_ARGS_POLICY)  # and back again
        assert (await client.post("/v1/admin/reload")).status_code == 200
        assert (await capabilities(client))["send_args"] is False
        assert (await check(client))["send_args"] is False


async def test_the_file_watcher_flips_send_args_without_a_request_to_reload(
    policy_file: Path,
) -> None:
    async with serving(file_app(policy_file, interval_s=0.05)) as client:
        assert (await capabilities(client))["send_args"] is False
        write(policy_file, NO_ARGS_POLICY + ARGS_POLICIES["match"])
        async with asyncio.timeout(10):  # a deadline, not a measurement
            while not (await capabilities(client))["send_args"]:
                await asyncio.sleep(0.02)
        assert (await check(client))["send_args"] is True


# -- conditions and counters keyed on args, over HTTP ------------------------------------


@pytest.fixture
async def guarded() -> AsyncIterator[httpx.AsyncClient]:
    async with serving(build_app(GUARD_POLICY)) as client:
        yield client


GUARD_CASES: list[tuple[str, dict[str, Any] | None, str, str]] = [
    ("terminal", {"command": "sudo rm -rf / --no-preserve-root"}, "deny", "destructive root"),
    ("terminal", {"command": "rm -rf /tmp/build"}, "allow", ""),
    ("terminal", None, "allow", ""),
    ("read", {"files": ["/etc/shadow", "/tmp/x"]}, "deny", "read: /etc is off limits"),
    ("read", {"files": ["/tmp/x", "/etc/shadow"]}, "allow", ""),
    ("git", {"cmd": "push", "opts": {"force": True}}, "deny", "no force push"),
    ("git", {"cmd": "push", "opts": {"force": False}}, "allow", ""),
    ("deploy", {"env": "prod"}, "ask", "a prod deploy without a ticket needs approval"),
    ("deploy", {"env": "prod", "ticket": "OPS-1"}, "allow", ""),
    ("deploy", {"env": "staging"}, "allow", ""),
    ("deploy", None, "allow", ""),  # no args: `exists: false` holds, `in` does not
    ("fetch", {"url": "http://10.0.0.1/admin"}, "deny", "internal addresses are off limits"),
    ("fetch", {"url": "https://example.com/?u=http://10.0.0.1"}, "allow", ""),
]


@pytest.mark.parametrize(("tool", "args", "decision", "message"), GUARD_CASES)
async def test_argument_conditions_decide_over_http(
    guarded: httpx.AsyncClient,
    tool: str,
    args: dict[str, Any] | None,
    decision: str,
    message: str,
) -> None:
    body: dict[str, Any] = {"tool": tool, "session": "s"}
    if args is not None:
        body["args"] = args
    answer = await check(guarded, **body)
    assert answer["decision"] == decision
    assert message in answer["message"]
    assert answer["send_args"] is True


async def test_the_same_args_in_any_key_order_and_spacing_share_a_counter(
    guarded: httpx.AsyncClient,
) -> None:
    bodies = [
        '{"user":"u","tool":"terminal","session":"s","args":{"command":"make","env":{"A":1,"B":[2]}}}',
        '{"args": {"env": {"B": [2], "A": 1}, "command": "make"}, "session": "s",'
        ' "tool": "terminal", "user": "u"}',
        '{ "user" : "u" ,\n "tool" : "terminal" , "session" : "s" ,\n'
        '  "args" : { "env" : { "A" : 1 , "B" : [ 2 ] } , "command" : "make" } }',
        '{"tool":"terminal","user":"u","args":{"command":"make","env":{"B":[2],"A":1}},"session":"s"}',
    ]
    answers = [await check_raw(guarded, body) for body in bodies]
    assert [a["decision"] for a in answers] == ["allow", "allow", "allow", "deny"]
    assert [a["limits"][0]["remaining"] for a in answers] == [2, 1, 0, 0]
    refused = answers[3]
    assert refused["message"] == REPEATED.format(tool="terminal")  # golden: no "(retry in"
    assert refused["retry_after"] == 600.0
    assert [(v["rule"], v["kind"]) for v in refused["violations"]] == [
        ("same-call-repeats", "rate")
    ]
    # A different command still runs, the same one in another session too.
    assert (await check(guarded, session="s", args={"command": "make test"}))["allowed"]
    assert (await check(guarded, session="t", args={"command": "make"}))["allowed"]


# -- args never stored or logged unless AUDIT_ARGS ----------------------------------------


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def audit_lines() -> Iterator[list[str]]:
    """The audit lines written while the test runs (the logger put back as it was after)."""
    logger = logging.getLogger("ratewarden.audit")
    saved = (logger.handlers[:], logger.propagate, logger.level)
    handler = _Lines()
    logger.handlers[:], logger.propagate = [handler], False
    logger.setLevel(logging.INFO)
    yield handler.lines
    logger.handlers[:], logger.propagate = saved[0], saved[1]
    logger.setLevel(saved[2])


SECRET_CALLS: list[dict[str, Any]] = [
    {"tool": "terminal", "args": {"command": f"rm -rf / {SECRET}"}},  # a condition denies
    {"tool": "deploy", "args": {"env": "prod", "note": SECRET}},  # a condition asks
    *({"tool": "curl", "session": "s", "args": {"token": SECRET}} for _ in range(4)),  # loop
]


@pytest.mark.parametrize("audit_args", [False, True])
async def test_args_stay_out_of_the_audit_and_denials_unless_audit_args(
    audit_lines: list[str], audit_args: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with serving(build_app(GUARD_POLICY, audit_args=audit_args)) as client:
        answers = [await check(client, **call) for call in SECRET_CALLS]
        assert [a["decision"] for a in answers] == ["deny", "ask", *["allow"] * 3, "deny"]
        denials = (await client.get("/v1/denials")).json()["denials"]
        metrics = (await client.get("/metrics")).text
    entries = [json.loads(line) for line in audit_lines]
    assert [e["rule"] for e in entries] == [
        "no-root-delete",
        "prod-only-by-ticket",
        "same-call-repeats",
    ]
    assert len(denials) == 3
    sent = [SECRET_CALLS[0]["args"], SECRET_CALLS[1]["args"], SECRET_CALLS[5]["args"]]
    if audit_args:
        assert [e["args"] for e in entries] == sent
        assert [d["args"] for d in denials] == sent[::-1]  # newest first
    else:
        assert [e for e in entries if "args" in e] == []
        assert [d for d in denials if d.get("args") is not None] == []
        assert SECRET not in "\n".join(audit_lines)
        assert SECRET not in json.dumps(denials)
    # Never in the answers, the metrics or the daemon's own logs.
    logged = [r.getMessage() for r in caplog.records if r.name != "ratewarden.audit"]
    assert SECRET not in json.dumps(answers) + metrics + "\n".join(logged)


# -- a hostile pass -------------------------------------------------------------------------

# Every argument is read: matched by a regex and a glob, counted whole and by one path.
READS_EVERYTHING = r"""
version: 1
rules:
  - name: nasty
    match: {args: {k: {regex: '(a+)+$'}}}
    deny: "matched"
  - name: escape
    match: {args: {k: "*\x1b*"}}
    deny: "a terminal escape sequence"
  - name: loops
    per: [tool, args]
    rate: 3/10 minutes
  - name: per-k
    per: [args.k]
    rate: 100/minute
"""


@pytest.fixture
async def reads_everything() -> AsyncIterator[httpx.AsyncClient]:
    async with serving(build_app(READS_EVERYTHING)) as client:
        yield client


async def test_args_at_their_caps_are_matched_and_hashed(
    reads_everything: httpx.AsyncClient,
) -> None:
    at_cap = args_of_size(MAX_ARGS_BYTES)
    assert len(json.dumps(at_cap, separators=(",", ":"), ensure_ascii=False).encode()) == (
        MAX_ARGS_BYTES
    )
    deepest = nested(MAX_ARGS_DEPTH)
    for args in (at_cap, deepest):
        answers = [await check(reads_everything, args=args) for _ in range(4)]
        assert [a["decision"] for a in answers] == ["allow"] * 3 + ["deny"]
        assert answers[3]["message"] == REPEATED.format(tool="terminal")
    for args in (args_of_size(MAX_ARGS_BYTES + 1), nested(MAX_ARGS_DEPTH + 1)):
        too_much = await reads_everything.post(
            "/v1/check", json={"user": "u", "tool": "terminal", "args": args}
        )
        assert refused_field(too_much) == "args"


# Keys and values with control characters, bidi marks and astral characters.
ODD_ARGS: list[dict[str, Any]] = [
    {"k\x00ey": "v\x01", "\x7f": "\t\n", "\u202e": "\u2066\u0301"},
    {"\U0001f600": "\u05d0\u200d\U0001f469", "k": "b"},
    {"\u202e": "\x00", "k": "\x1b[31m"},  # the escape glob refuses it
]


@pytest.mark.parametrize("args", ODD_ARGS)
async def test_control_characters_in_keys_and_values_are_matched_and_counted(
    reads_everything: httpx.AsyncClient, args: dict[str, Any]
) -> None:
    reordered = dict(reversed(args.items()))
    answers = [await check(reads_everything, tool="odd", args=a) for a in [args, reordered] * 2]
    if "\x1b" in args.get("k", ""):
        assert {a["message"] for a in answers} == {"a terminal escape sequence"}
        return
    assert [a["decision"] for a in answers] == ["allow"] * 3 + ["deny"]
    assert answers[3]["message"] == REPEATED.format(tool="odd")


@pytest.mark.parametrize(
    "args",
    [r'{"\ud800": "x"}', r'{"k": "\udfff"}', r'{"k": ["a\ud83d"]}', r'{"k": {"\udc00": 1}}'],
)
async def test_a_lone_surrogate_in_args_is_a_422_naming_args(
    reads_everything: httpx.AsyncClient, args: str
) -> None:
    """JSON can escape half a surrogate pair; UTF-8 cannot carry it, so such args could
    reach no audit line: refused as the wire refuses them (test_hole_requests.py)."""
    body = '{"user": "u", "tool": "odd", "args": ' + args + "}"
    refused = await reads_everything.post(
        "/v1/check", content=body.encode(), headers={"content-type": "application/json"}
    )
    assert refused_field(refused) == "args"


@pytest.mark.parametrize("args", [[1, 2], "rm -rf /", 3, True, [{"command": "ls"}]])
async def test_args_that_are_not_an_object_are_a_422_naming_args(
    reads_everything: httpx.AsyncClient, args: Any
) -> None:
    body = {"user": "u", "tool": "terminal", "args": args}
    assert refused_field(await reads_everything.post("/v1/check", json=body)) == "args"
    batch = await reads_everything.post("/v1/check/batch", json={"calls": [body]})
    assert refused_field(batch) == "calls[0].args"


async def test_a_backtracking_regex_decides_on_a_64_kib_argument(
    reads_everything: httpx.AsyncClient,
) -> None:
    """`(a+)+$` against a long run of `a` ending in `!` takes a backtracking engine time
    exponential in the run; RE2 reads it once (the unit tests count its work)."""
    overhead = len('{"k":""}')
    no_match = {"k": "a" * (MAX_ARGS_BYTES - overhead - 1) + "!"}
    match = {"k": "a" * (MAX_ARGS_BYTES - overhead)}
    assert (await check(reads_everything, args=no_match))["decision"] == "allow"
    refused = await check(reads_everything, args=match)
    assert (refused["decision"], refused["message"]) == ("deny", "matched")
