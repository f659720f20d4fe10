"""Hot reload of the policy: `POST /v1/admin/reload`, the file watcher, and SIGHUP.

A valid new file is swapped in at once; an invalid one is refused whole (the old policy
stays, every error is reported, logged and counted); and no answer ever comes from a mix
of two policies, even with reloads racing concurrent checks. The SIGHUP tests run
`ratewarden serve` as a real process; the watcher is also proven with two workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import signal
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from fastapi import FastAPI

from ratewarden.clock import FakeClock
from ratewarden.limiter.ops import CallRecord, CounterOp, Evaluation
from ratewarden.policy import PolicyError, load_example_policy, load_policy, parse_policy
from ratewarden.service import reload as reload_module
from ratewarden.service.app import create_app
from ratewarden.service.settings import Settings
from ratewarden.store import MemoryStore, Store
from ratewarden.store.redis_store import RedisStore
from tests.helpers.app import assert_error_shape, serving
from tests.helpers.hostenv import clean_environment
from tests.helpers.redis_server import RedisServer
from tests.service.test_auth import ADMIN_TOKEN, running

POLICY_A = """\
version: 1
rules:
  - name: r1
    match: {tool: [t, gated]}
    rate: 1000/minute
  - name: r2
    match: {tool: t}
    rate: 2000/hour
  - name: gate
    match: {tool: gated}
    rate: 0/minute
    message: "policy A refuses"
"""
POLICY_B = (
    POLICY_A.replace("1000/minute", "1001/minute")
    .replace("2000/hour", "2001/hour")
    .replace("policy A", "policy B")
)
# What a check answers under each policy: (limits as (rule, limit) pairs, message).
EXPECTED_ANSWERS = {
    "A": {"t": ({("r1", 1000), ("r2", 2000)}, ""),
          "gated": ({("r1", 1000), ("gate", 0)}, "policy A refuses")},
    "B": {"t": ({("r1", 1001), ("r2", 2001)}, ""),
          "gated": ({("r1", 1001), ("gate", 0)}, "policy B refuses")},
}  # fmt: skip
BAD_POLICY = """\
version: 1
rules:
  - name: r1
    match: {tool: t}
    rate: ten per minute
  - name: r1
    rate: 5/minute
    colour: blue
"""
VERSION_A = parse_policy(POLICY_A.encode()).version
VERSION_B = parse_policy(POLICY_B.encode()).version
DEADLINE_S = 10.0


@pytest.fixture(autouse=True)
def no_ratewarden_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RATEWARDEN_"):
            monkeypatch.delenv(name)


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY_A)
    return path


def make_app(
    policy: Path | None, store: Store | None = None, interval_s: float = 0, **values: Any
) -> FastAPI:
    settings = Settings(
        store_url="memory://",
        policy=policy,
        reload_interval_s=interval_s,
        store_timeout_ms=values.pop("store_timeout_ms", 100),
        **values,
    )
    return create_app(settings, store=store or MemoryStore(FakeClock()))


def sample(app: FastAPI, name: str, **labels: str) -> float | None:
    value: float | None = app.state.observer.metrics.registry.get_sample_value(name, labels)
    return value


def reloads(app: FastAPI, result: str) -> float | None:
    return sample(app, "ratewarden_policy_reloads_total", result=result)


async def version_of(client: httpx.AsyncClient) -> str:
    answer = await client.get("/v1/policy")
    assert answer.status_code == 200
    version: str = answer.json()["version"]
    return version


def policy_of(tool: str, answer: dict[str, Any]) -> list[str]:
    """Which of the two policies this answer is consistent with, entirely: its limits, its
    message, and the counters behind them (each user is fresh, so a counter evaluated
    under the limit it reports has one call left over if the call was allowed, and all
    of its limit if it was refused, since a refusal consumes nothing)."""
    limits = {(limit["rule"], limit["limit"]) for limit in answer["limits"]}
    used = 1 if answer["allowed"] else 0
    if any(limit["remaining"] != max(limit["limit"] - used, 0) for limit in answer["limits"]):
        return []
    return [
        name
        for name, by_tool in EXPECTED_ANSWERS.items()
        if by_tool[tool] == (limits, answer["message"])
    ]


def write(path: Path, text: str) -> None:
    """Replace the file's content the way editors and config management do: atomically."""
    fresh = path.with_suffix(".tmp")
    fresh.write_text(text)
    fresh.replace(path)


# -- the endpoint ------------------------------------------------------------------------


async def test_reload_endpoint_swaps_in_a_valid_file(policy_file: Path) -> None:
    app = make_app(policy_file)
    async with serving(app) as client:
        before = await client.post("/v1/check", json={"user": "u", "tool": "gated"})
        assert policy_of("gated", before.json()) == ["A"]
        write(policy_file, POLICY_B)
        answer = await client.post("/v1/admin/reload")
        assert answer.status_code == 200, answer.text
        assert answer.json() == {
            "version": VERSION_B,
            "previous_version": VERSION_A,
            "changed": True,
            "source": str(policy_file),
            "rules": 3,
            "pid": os.getpid(),
        }
        assert await version_of(client) == VERSION_B
        after = await client.post("/v1/check", json={"user": "u", "tool": "gated"})
        assert policy_of("gated", after.json()) == ["B"]
        assert reloads(app, "ok") == 2  # the start-up load, and this reload
        assert reloads(app, "error") is None
        info = "ratewarden_policy_info"
        assert sample(app, info, version=VERSION_B) == 1
        assert sample(app, info, version=VERSION_A) is None  # removed, one process
        # The same file again: still a success, nothing changes.
        again = await client.post("/v1/admin/reload")
        assert again.json()["changed"] is False
        assert again.json()["version"] == VERSION_B


async def test_reload_endpoint_refuses_an_invalid_file_whole(
    policy_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(policy_file)
    async with serving(app) as client:
        write(policy_file, BAD_POLICY)
        with pytest.raises(PolicyError) as raised:
            load_policy(policy_file)
        lines = raised.value.lines()
        assert len(lines) >= 3, lines  # every problem, not just the first
        answer = await client.post("/v1/admin/reload")
        assert answer.status_code == 422
        body = answer.json()
        assert_error_shape(body)
        assert body["error"] == "invalid_policy"
        assert body["message"] == (
            f"policy not reloaded; version {VERSION_A} stays in force: " + "; ".join(lines)
        )
        assert [f["message"] for f in body["fields"]] == lines
        assert [f["field"] for f in body["fields"]] == [i.field for i in raised.value.issues]
        assert lines[0] == f"{policy_file}:5: rules[0].rate: " + (
            'expected "N/window" (e.g. "10/minute", "5/10 minutes"), got \'ten per minute\' '
            "(rule 'r1')"
        )
        assert re.match(rf"^{re.escape(str(policy_file))}:\d+: ", lines[-1])
        # Nothing of the bad file applies; the old policy decides.
        assert await version_of(client) == VERSION_A
        check = await client.post("/v1/check", json={"user": "u", "tool": "t"})
        assert policy_of("t", check.json()) == ["A"]
        assert (reloads(app, "ok"), reloads(app, "error")) == (1, 1)
        assert sample(app, "ratewarden_policy_info", version=VERSION_A) == 1
        logged = [r for r in caplog.records if r.name == "ratewarden.reload"]
        assert [r.levelno for r in logged] == [logging.ERROR]
        message = logged[0].getMessage()
        assert message.startswith(
            f"policy reload (POST /v1/admin/reload) refused; version {VERSION_A} stays in force:"
        )
        assert all(line in message for line in lines)
        # A missing file is refused the same way.
        policy_file.unlink()
        missing = await client.post("/v1/admin/reload")
        assert missing.status_code == 422
        assert missing.json()["fields"] == [
            {
                "field": "(top level)",
                "message": f"{policy_file}: (top level): cannot read: No such file or directory",
            }
        ]
        assert await version_of(client) == VERSION_A


async def test_reload_without_a_file_reloads_the_packaged_example(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no ./ratewarden.yaml here
    example = load_example_policy()
    app = make_app(None, interval_s=0.05)
    async with serving(app) as client:
        assert app.state.reloader._watcher is None  # nothing to watch
        answer = await client.post("/v1/admin/reload")
        assert answer.status_code == 200
        assert answer.json()["source"] == "<packaged example.yaml>"
        assert answer.json()["version"] == example.version
        assert answer.json()["changed"] is False


async def test_reload_needs_an_admin_token(policy_file: Path) -> None:
    app = make_app(policy_file, api_tokens=["check-token"], admin_tokens=["admin-token"])
    async with serving(app) as client:
        assert (await client.post("/v1/admin/reload")).status_code == 401
        check = {"authorization": "Bearer check-token"}
        assert (await client.post("/v1/admin/reload", headers=check)).status_code == 403
        admin = {"authorization": "Bearer admin-token"}
        assert (await client.post("/v1/admin/reload", headers=admin)).status_code == 200


# -- the watcher -------------------------------------------------------------------------


async def eventually(condition: Callable[[], Any], what: str) -> None:
    """Poll `condition` (sync or async) until true, within DEADLINE_S."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        found = condition()
        if asyncio.iscoroutine(found):
            found = await found
        if found:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"not within {DEADLINE_S}s: {what}")
        await asyncio.sleep(0.02)


async def test_the_watcher_picks_up_changes_and_reports_a_bad_file_once(
    policy_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    interval = 0.05
    app = make_app(policy_file, interval_s=interval)
    async with serving(app) as client:

        async def version_is(expected: str) -> bool:
            return await version_of(client) == expected

        write(policy_file, POLICY_B)
        await eventually(lambda: version_is(VERSION_B), "the watcher loads policy B")
        assert reloads(app, "ok") == 2

        write(policy_file, BAD_POLICY)
        await eventually(lambda: reloads(app, "error") == 1, "the watcher refuses the bad file")
        await asyncio.sleep(10 * interval)  # many more polls: refused once, not every poll
        assert reloads(app, "error") == 1
        assert await version_of(client) == VERSION_B
        refused = [r for r in caplog.records if "refused" in r.getMessage()]
        assert len(refused) == 1
        assert refused[0].getMessage().startswith("policy reload (file change) refused; ")

        write(policy_file, POLICY_A)
        await eventually(lambda: version_is(VERSION_A), "the watcher loads the fixed file")
        # Touching the file without changing it reloads nothing.
        os.utime(policy_file)
        await asyncio.sleep(10 * interval)
        assert reloads(app, "ok") == 3


async def test_the_watcher_is_off_at_zero(policy_file: Path) -> None:
    app = make_app(policy_file, interval_s=0)
    async with serving(app) as client:
        assert app.state.reloader._watcher is None
        write(policy_file, POLICY_B)
        await asyncio.sleep(0.3)
        assert await version_of(client) == VERSION_A


async def test_the_watcher_waits_for_a_file_being_written(
    policy_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file still changing between two reads is not loaded; the next poll loads it."""
    app = make_app(policy_file)
    reloader = app.state.reloader
    # Half-written: valid YAML, and a valid policy of fewer rules.
    truncated = POLICY_B[: POLICY_B.index("  - name: gate")].encode()
    assert len(parse_policy(truncated).rules) == 2
    reads = iter([truncated, POLICY_B.encode()])
    real_read = reload_module._read_or_none
    monkeypatch.setattr(
        reload_module, "_read_or_none", lambda path: next(reads, None) or real_read(path)
    )
    monkeypatch.setattr(reload_module, "SETTLE_S", 0)
    write(policy_file, POLICY_B)
    async with serving(app) as client:
        assert await reloader.poll() is False  # the two reads differ
        assert await version_of(client) == VERSION_A
        assert await reloader.poll() is True
        assert await version_of(client) == VERSION_B
        assert await reloader.poll() is False  # nothing new


def test_the_watchers_hash_is_the_policy_version() -> None:
    from ratewarden.policy.compile import policy_version  # the reloader's, and compile's

    for text in (POLICY_A, POLICY_B, BAD_POLICY):
        raw = text.encode()
        assert policy_version(raw) == hashlib.sha256(raw).hexdigest()[:16]
    assert policy_version(POLICY_A.encode()) == VERSION_A
    assert policy_version(POLICY_B.encode()) == VERSION_B


# -- never half a policy -----------------------------------------------------------------


class YieldingStore:
    """A store that gives the event loop away before and after each decision, so checks
    are in flight (between reading the policy and answering) while reloads swap it."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.in_flight = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def evaluate(
        self, ops: Sequence[CounterOp], record: CallRecord | None = None, dry_run: bool = False
    ) -> Evaluation:
        self.in_flight += 1
        try:
            await asyncio.sleep(0)
            found = await self.inner.evaluate(ops, record, dry_run)
            await asyncio.sleep(0)
            return found
        finally:
            self.in_flight -= 1


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def inner_store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    if request.param == "memory":
        yield MemoryStore(FakeClock())
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    server.client().flushall()
    store = RedisStore(aioredis.Redis.from_url(server.url), server.url)
    yield store
    with contextlib.suppress(Exception):
        await store.close()


@pytest.mark.slow
async def test_every_answer_comes_from_exactly_one_policy_while_reloading(
    policy_file: Path, inner_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = YieldingStore(inner_store)
    app = make_app(policy_file, store, store_timeout_ms=10_000)
    swaps_in_flight: list[int] = []
    metrics = app.state.observer.metrics
    loaded = metrics.policy_loaded

    def on_swap(policy: Any) -> None:  # called right after the swap, in the same step
        swaps_in_flight.append(store.in_flight)
        loaded(policy)

    # On the class: Metrics is slotted, its methods cannot be replaced on an instance.
    monkeypatch.setattr(type(metrics), "policy_loaded", lambda _self, policy: on_swap(policy))
    answers: list[tuple[str, dict[str, Any]]] = []
    done = asyncio.Event()
    async with serving(app) as client:

        async def checker(worker: int) -> None:
            n = 0
            while not done.is_set():
                tool = "gated" if n % 2 else "t"
                user = f"w{worker}-{n}"  # a fresh user: no limit is ever reached
                answer = await client.post("/v1/check", json={"user": user, "tool": tool})
                assert answer.status_code == 200, answer.text
                answers.append((tool, answer.json()))
                n += 1

        async def reloader() -> None:
            try:
                for i in range(60):
                    write(policy_file, POLICY_B if i % 2 == 0 else POLICY_A)
                    answer = await client.post("/v1/admin/reload")
                    assert answer.status_code == 200, answer.text
                    assert answer.json()["changed"] is True
            finally:
                done.set()

        await asyncio.gather(reloader(), *(checker(w) for w in range(12)))

    inconsistent = [(tool, a) for tool, a in answers if len(policy_of(tool, a)) != 1]
    assert inconsistent == [], inconsistent[:3]
    seen = {policy_of(tool, a)[0] for tool, a in answers}
    assert seen == {"A", "B"}
    assert len(answers) > 200
    assert len(swaps_in_flight) == 61  # start-up and 60 reloads
    # The proof has teeth: many swaps happened with decisions half-way through.
    assert sum(1 for n in swaps_in_flight if n > 0) >= 20, swaps_in_flight


# -- SIGHUP, and workers kept in step, as real processes -----------------------------------


def wait_for(condition: Callable[[], bool], what: str, log: Callable[[], str]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {DEADLINE_S}s: {what}\n{log()}")
        time.sleep(0.05)  # bounded polling of a real process


def test_sighup_reloads_a_running_daemon(tmp_path: Path, policy_file: Path) -> None:
    with running(tmp_path, "--policy", str(policy_file), "--reload-interval", "0") as daemon:
        http = httpx.Client(base_url=daemon.url, trust_env=False)

        def version() -> str:
            answer = http.get("/v1/policy")
            assert answer.status_code == 200
            found: str = answer.json()["version"]
            return found

        assert version() == VERSION_A
        write(policy_file, POLICY_B)
        time.sleep(0.3)
        assert version() == VERSION_A  # the watcher is off: only the signal reloads
        daemon.process.send_signal(signal.SIGHUP)
        wait_for(lambda: version() == VERSION_B, "SIGHUP loads policy B", daemon.log_text)
        gated = http.post("/v1/check", json={"user": "u", "tool": "gated"}).json()
        assert policy_of("gated", gated) == ["B"]
        assert (
            f"policy reloaded (SIGHUP): {policy_file} version {VERSION_A} -> {VERSION_B}, 3 rules"
        ) in daemon.log_text()

        write(policy_file, BAD_POLICY)
        daemon.process.send_signal(signal.SIGHUP)
        wait_for(
            lambda: "policy reload (SIGHUP) refused" in daemon.log_text(),
            "SIGHUP refuses the bad file",
            daemon.log_text,
        )
        assert daemon.process.poll() is None  # still running
        assert version() == VERSION_B
        log = daemon.log_text()
        assert f"policy reload (SIGHUP) refused; version {VERSION_B} stays in force:" in log
        with pytest.raises(PolicyError) as raised:
            load_policy(policy_file)
        assert all(line in log for line in raised.value.lines())
        metrics = http.get("/metrics").text
        assert 'ratewarden_policy_reloads_total{result="error"} 1.0' in metrics
        assert 'ratewarden_policy_reloads_total{result="ok"} 2.0' in metrics
        assert f'ratewarden_policy_info{{version="{VERSION_B}"}} 1.0' in metrics
        http.close()


@pytest.mark.redis
@pytest.mark.slow
def test_the_watcher_keeps_every_worker_in_step(
    tmp_path: Path, policy_file: Path, redis_server: RedisServer
) -> None:
    """Two workers, one file change: `ratewarden_policy_info` is the max over the workers,
    so the old version reads 0 only once every worker has loaded the new one."""
    redis_server.client().flushall()
    flags = ["--workers", "2", "--store-url", redis_server.url, "--policy", str(policy_file),
             "--reload-interval", "0.2"]  # fmt: skip
    env = clean_environment(RATEWARDEN_ADMIN_TOKENS=ADMIN_TOKEN)
    with (
        running(tmp_path, *flags, env=env) as daemon,
        httpx.Client(base_url=daemon.url, trust_env=False) as http,
    ):

        def info(version: str) -> str | None:
            found = re.search(
                rf'^ratewarden_policy_info{{version="{version}"}} (\S+)$',
                http.get("/metrics").text,
                re.MULTILINE,
            )
            return found.group(1) if found else None

        wait_for(lambda: daemon.log_text().count(" ready on ") == 2, "two workers", daemon.log_text)
        assert info(VERSION_A) == "1.0"
        write(policy_file, POLICY_B)
        wait_for(lambda: info(VERSION_A) == "0.0", "every worker leaves A", daemon.log_text)
        assert info(VERSION_B) == "1.0"
        assert daemon.log_text().count(f"policy reloaded (file change): {policy_file} version") == 2
        headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}
        for _ in range(10):
            with httpx.Client(base_url=daemon.url, trust_env=False) as fresh:
                assert fresh.get("/v1/policy", headers=headers).json()["version"] == VERSION_B
