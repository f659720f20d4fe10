"""The hot path (service/hotpath.py) answers exactly what FastAPI's routes answer.

Two apps on identical stores and fake clocks, one with the hot path and one without,
get the same stream of requests: valid, invalid, not JSON, wrong content types, batches,
repeated and conflicting call ids. Every answer must match in status, content type and
JSON body (generated call ids aside). Then the hot path is shown to be the one serving
valid requests, and auth and the body cap to still apply in front of it.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from ratewarden.clock import FakeClock
from ratewarden.service import routes
from ratewarden.service.app import Daemon
from ratewarden.service.hotpath import HotPath
from ratewarden.store import MemoryStore
from tests.helpers.app import build_app, serving

POLICY = """\
version: 1
tools:
  default: {cost: 0.5}
rules:
  - {name: per-user, per: [user], rate: 3/minute}
  - {name: per-tool, per: [user, tool], rate: 2/minute, algorithm: token_bucket}
  - {name: spend, per: [user], budget: 2.00/day, soft_limit: 50%}
  - {name: slots, per: [team], concurrency: 1}
  - {name: asks, per: [session], rate: 1/minute, on_exceed: ask}
  - {name: watch, per: [], rate: 2/minute, mode: shadow}
  - {name: loop, match: {tool: browser}, per: [user, tool, args], rate: 1/minute}
  - name: no-key-a
    match: {tool: terminal, args: {a: {exists: true}}}
    deny: "not with an argument a"
  - {name: no-bots, match: {tool: "*-bot", destructive: true}, deny: "{tool}: never"}
"""
GENERATED = re.compile(r"rw-[0-9a-f]{32}")
JSON = {"content-type": "application/json"}
NOW = 1_700_000_000_000 + 17_345


def make_app(*, hot: bool, **settings: Any) -> FastAPI:
    return build_app(POLICY, MemoryStore(FakeClock(NOW)), hot=hot, **settings)


@asynccontextmanager
async def both() -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    async with serving(make_app(hot=True)) as hot, serving(make_app(hot=False)) as plain:
        yield hot, plain


def normalised(response: httpx.Response) -> tuple[int, str, Any]:
    """Status, content type and parsed body, numbers tagged with their JSON type: `5` and
    `5.0` compare equal in Python, and a client in another language would tell them apart."""
    try:
        body: Any = json.loads(
            GENERATED.sub("rw-generated", response.text),
            parse_int=lambda text: ("int", int(text)),
            parse_float=lambda text: ("float", float(text)),
        )
    except ValueError:
        body = response.text
    return response.status_code, response.headers.get("content-type", ""), body


subjects = st.one_of(
    st.sampled_from(["alice", "bob", "team-a", "s1", "terminal", "browser", "x-bot"]),
    st.text(max_size=4),
    st.text(min_size=255, max_size=258),
    st.integers(),
    st.none(),
)
costs = st.one_of(
    st.none(),
    st.floats(allow_nan=False, allow_infinity=False, min_value=-1, max_value=3),
    st.sampled_from([0, 1e9, 1e10, "0.5", True]),
)
metadata = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {},
        optional={
            "readOnlyHint": st.one_of(st.booleans(), st.just("yes")),
            "destructiveHint": st.booleans(),
            "tags": st.lists(st.sampled_from(["a", "", "t" * 65]), max_size=3),
            "bogus": st.just(1),
        },
    ),
)
check_bodies = st.fixed_dictionaries(
    {},
    optional={
        "user": subjects,
        "tool": subjects,
        "session": subjects,
        "team": subjects,
        "cost": costs,
        "call_id": st.one_of(st.sampled_from(["c1", "c2", "c3", "", "a\nb"]), st.integers()),
        "approved": st.one_of(st.booleans(), st.sampled_from([1, "true"])),
        "metadata": metadata,
        "args": st.one_of(st.none(), st.dictionaries(st.text(max_size=3), st.integers())),
        "extra": st.just("x"),
    },
)
RAW = [
    b"",
    b"{",
    b"[]",
    b"null",
    b'{"user": "alice", "tool": "terminal"',
    b'{"user": "alice", "tool": "terminal", "cost": NaN}',
    b'{"user": "alice", "tool": "terminal", "cost": Infinity}',
    b'{"user": "alice", "user": "bob", "tool": "terminal"}',
    b'{"user": "al\\u0000ice", "tool": "terminal"}',
    b'{"user": "\\ud800", "tool": "terminal"}',
    b'\xff\xfe{"user": "alice"}',
    '{"user": "ålice", "tool": "términal"}'.encode(),
    b'{"calls": []}',
]
content_types = st.sampled_from(
    [
        "application/json",
        "application/json; charset=utf-8",
        "Application/JSON",
        "text/plain",
        "application/x-www-form-urlencoded",
        None,
    ]
)


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, bytes, str | None]:
    path = draw(st.sampled_from(["/v1/check", "/v1/check/batch"]))
    if draw(st.integers(0, 4)) == 0:
        body = draw(st.sampled_from(RAW))
    elif path == "/v1/check":
        body = json.dumps(draw(check_bodies)).encode()
    else:
        calls = draw(st.lists(check_bodies, min_size=0, max_size=4))
        body = json.dumps({"calls": calls}).encode()
    return path, body, draw(content_types)


@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=st.lists(requests(), min_size=1, max_size=12))
@pytest.mark.slow
async def test_the_hot_path_answers_exactly_like_fastapi(
    stream: list[tuple[str, bytes, str | None]],
) -> None:
    async with both() as (hot, plain):
        for path, body, content_type in stream:
            headers = {"content-type": content_type} if content_type else {}
            answers = [await c.post(path, content=body, headers=headers) for c in (hot, plain)]
            fast, slow = (normalised(a) for a in answers)
            assert fast == slow, (path, body, content_type)


async def test_valid_decisions_are_served_by_the_hot_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Valid requests and bodies of the wrong shape are answered by the hot path (each
    body is validated once), and so is any body over LARGE_BODY, which it reads with
    wire.read_json whatever it holds; a small one pydantic-core cannot read (a lone
    surrogate) is handed to FastAPI."""
    served: list[tuple[str, bool]] = []
    for name in ("_check", "_batch"):
        original = getattr(HotPath, name)

        async def spy(self: HotPath, app: Any, body: bytes, _original: Any = original) -> Any:
            answer = await _original(self, app, body)
            served.append((body.decode()[:12], answer is not None))
            return answer

        monkeypatch.setattr(HotPath, name, spy)
    async with serving(make_app(hot=True)) as client:
        one = await client.post("/v1/check", json={"user": "alice", "tool": "terminal"})
        batch = await client.post(
            "/v1/check/batch", json={"calls": [{"user": "bob", "tool": "terminal"}] * 2}
        )
        invalid = await client.post("/v1/check", json={"user": "alice"})
        huge = b'{"user": "alice", "tool": "terminal", "cost": ' + b"1" * 5000 + b"}"
        unread = await client.post("/v1/check", content=huge, headers=JSON)
        surrogate = b'{"user": "\\ud800", "tool": "terminal"}'
        small = await client.post("/v1/check", content=surrogate, headers=JSON)
    assert (one.status_code, batch.status_code, invalid.status_code) == (200, 200, 422)
    assert len(batch.json()["results"]) == 2
    assert invalid.json()["fields"] == [{"field": "tool", "message": "required field is missing"}]
    assert (unread.status_code, unread.json()["fields"][0]["field"]) == (422, "cost")
    assert small.status_code == 422, small.text
    assert [ours for _, ours in served] == [True, True, True, True, False], served


async def test_auth_and_the_body_cap_still_apply_in_front_of_the_hot_path() -> None:
    app = make_app(hot=True, api_tokens=["check-token"], max_body_bytes=1024)
    body = {"user": "alice", "tool": "terminal"}
    async with serving(app) as client:
        anonymous = await client.post("/v1/check", json=body)
        wrong = await client.post("/v1/check", json=body, headers={"authorization": "Bearer nope"})
        good = {"authorization": "Bearer check-token"}
        allowed = await client.post("/v1/check", json=body, headers=good)
        too_large = await client.post(
            "/v1/check",
            content=json.dumps({**body, "args": {"x": "y" * 2000}}),
            headers={**good, "content-type": "application/json"},
        )
    assert (anonymous.status_code, wrong.status_code) == (401, 401)
    assert allowed.status_code == 200
    assert too_large.status_code == 413
    assert too_large.json()["fields"][0]["field"] == "body"


async def test_valid_decisions_skip_fastapis_stack_and_the_rest_go_through_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hot path sits in front of FastAPI: a valid decision or a body of the wrong
    shape never enters its middleware stack; JSON it cannot read, and every other route,
    do."""
    entered: list[str] = []
    original = Daemon.stack

    async def spy(self: Daemon, scope: Any, receive: Any, send: Any) -> None:
        entered.append(scope["path"])
        await original(self, scope, receive, send)

    monkeypatch.setattr(Daemon, "stack", spy)
    async with serving(make_app(hot=True)) as client:
        assert (await client.post("/v1/check", json={"user": "a", "tool": "t"})).status_code == 200
        assert (await client.post("/v1/check", json={"user": "a"})).status_code == 422
        assert (await client.post("/v1/check", content=b"{", headers=JSON)).status_code == 422
        assert (await client.get("/healthz")).status_code == 200
    assert entered == ["/v1/check"]  # only the unreadable one; /healthz never meets the front


async def test_a_bug_on_the_hot_path_gets_the_same_500_as_fastapis_catch_all(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """In front of FastAPI, the hot path answers a bug itself, as errors.py's catch-all
    would: the one error shape, and the stack trace in the log (never the body)."""

    async def broken(app: Any, body: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(routes, "decide", broken)
    async with serving(make_app(hot=True)) as client:
        answer = await client.post("/v1/check", json={"user": "a", "tool": "secret-tool"})
    assert answer.status_code == 500
    assert answer.json() == {
        "error": "internal_error",
        "message": "internal error; see the daemon's log",
        "fields": [],
    }
    assert "unexpected error on POST /v1/check" in caplog.text
    assert "RuntimeError: a bug" in caplog.text  # the stack trace
    assert "secret-tool" not in caplog.text
