"""Remembered refusals on a real redis-server, whose `TIME` is the only clock.

- What a looping agent costs Redis: after the first refusal, repeated attempts run no
  script. Counted by Redis itself (`INFO commandstats`, every command it ran, those run
  inside scripts included), in process and through a real daemon over HTTP; with
  remembered refusals off, the same count sees one script run per attempt.
- Two daemons (two spawned processes, each with its own engine and its own cache) race
  many attempts on one 5/minute counter: exactly 5 are admitted, whatever either cache
  remembered when.
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from ratewarden.calls import Call
from ratewarden.engine import Engine
from ratewarden.policy import parse_policy
from ratewarden.store import store_from_url
from tests.helpers.daemon import Daemon, clean_environment, running_daemon
from tests.helpers.races import race
from tests.helpers.redis_server import RedisServer

pytestmark = pytest.mark.redis

POLICY = "version: 1\nrules:\n  - {name: per-user, per: [user], rate: 5/minute}\n"
LIMIT = 5
ATTEMPTS = 1000  # after the first refusal
SCRIPTS = ("cmdstat_evalsha", "cmdstat_eval")
# What the fleet's poll runs in its script (store/redis_store.py `_BEAT`).
FLEET_POLL = (
    "cmdstat_time",
    "cmdstat_zrangebyscore",
    "cmdstat_zremrangebyscore",
    "cmdstat_hdel",
    "cmdstat_hset",
    "cmdstat_zadd",
    "cmdstat_get",
    "cmdstat_hgetall",
)
CONNECTING = ("cmdstat_hello", "cmdstat_client|setinfo", "cmdstat_select")
# Who is blocked (service/activity.py, store/redis_activity.py): the user's own list of
# refusals beside the shared one, and the counts flushed every 5 s; plain commands.
WHO_IS_BLOCKED = (
    "cmdstat_pexpire",
    "cmdstat_zadd",
    "cmdstat_zremrangebyscore",
    "cmdstat_zcard",
    "cmdstat_zincrby",
    "cmdstat_zremrangebyrank",
    "cmdstat_zrange",
)


class Commandstats:
    """Calls of each command Redis ran so far, read on one connection kept open (a new
    one would count its HELLO), INFO's own left out."""

    def __init__(self, server: RedisServer) -> None:
        self._client = server.client()

    def __enter__(self) -> Commandstats:
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.close()

    def read(self) -> dict[str, int]:
        info: dict[str, Any] = self._client.info("commandstats")
        return {
            name: int(stats["calls"])
            for name, stats in info.items()
            if name.startswith("cmdstat_") and name != "cmdstat_info"
        }


def delta(before: dict[str, int], after: dict[str, int], names: tuple[str, ...] = ()) -> int:
    """Commands run between two snapshots: those in `names`, or all of them."""
    wanted = names or tuple(after)
    return sum(after.get(name, 0) - before.get(name, 0) for name in wanted)


# -- what a looping agent costs Redis ---------------------------------------------------


@pytest.mark.parametrize("remember", [True, False], ids=["remembered", "off"])
async def test_a_refused_call_repeated_runs_no_script(
    redis_server: RedisServer, redis_url: str, remember: bool
) -> None:
    store = store_from_url(redis_url)
    await store.start()
    try:
        engine = Engine(parse_policy(POLICY.encode()), store, remember_refusals=remember)
        first = [await engine.check(Call("alice", "terminal", f"c{i}")) for i in range(LIMIT + 1)]
        assert [d.decision for d in first] == ["allow"] * LIMIT + ["deny"]
        with Commandstats(redis_server) as stats:
            before = stats.read()
            for i in range(ATTEMPTS):
                decision = await engine.check(Call("alice", "terminal", f"again-{i}"))
                assert decision.decision == "deny"
                assert not decision.degraded
            after = stats.read()
    finally:
        await store.close()
    scripts, commands = delta(before, after, SCRIPTS), delta(before, after)
    if remember:
        assert scripts / ATTEMPTS < 0.01, (scripts, after)
        assert commands / ATTEMPTS < 0.01, (commands, after)
        assert engine.refusals.hits == ATTEMPTS
    else:  # the count sees every script run: one per attempt
        assert scripts == ATTEMPTS
        assert engine.refusals.hits == 0


@pytest.fixture
def daemon(redis_url: str, tmp_path: Path) -> Iterator[Daemon]:
    (tmp_path / "policy.yaml").write_text(POLICY)
    env = clean_environment(RATEWARDEN_STATE_FILE="off", RATEWARDEN_RELOAD_INTERVAL_S="0")
    flags = ("--store-url", redis_url, "--policy", "policy.yaml", "--log-level", "warning")
    with running_daemon(tmp_path, *flags, env=env) as running:
        yield running


def hammer(daemon: Daemon, attempts: int) -> list[str]:
    """Alice's call, `attempts` times over one keep-alive connection: the decisions."""
    with httpx.Client(base_url=daemon.url, trust_env=False, timeout=10.0) as http:
        body = {"user": "alice", "tool": "terminal"}
        return [http.post("/v1/check", json=body).json()["decision"] for _ in range(attempts)]


def remembered_metric(daemon: Daemon) -> float:
    text = httpx.get(f"{daemon.url}/metrics", trust_env=False, timeout=10.0).text
    name = "ratewarden_remembered_refusals_total "
    [value] = [line.removeprefix(name) for line in text.splitlines() if line.startswith(name)]
    return float(value)


def test_a_daemon_hammered_over_http_runs_no_script(
    redis_server: RedisServer, daemon: Daemon
) -> None:
    assert hammer(daemon, LIMIT + 1) == ["allow"] * LIMIT + ["deny"]
    with Commandstats(redis_server) as stats:
        before = stats.read()
        assert set(hammer(daemon, ATTEMPTS)) == {"deny"}
        after = stats.read()
    assert delta(before, after, SCRIPTS) / ATTEMPTS < 0.01, after
    # All else is the audit trail filling the recent-denials list: one LPUSH and LTRIM
    # per batch, five batches a second whatever the rate of attempts (and the set-up of
    # the pooled connection that sends them), and the fleet's poll (service/fleet.py), one
    # script a second: the commands it runs inside; and who is blocked.
    others = {name for name in after if delta(before, after, (name,))} - set(SCRIPTS)
    known = {"cmdstat_lpush", "cmdstat_ltrim", *FLEET_POLL, *CONNECTING, *WHO_IS_BLOCKED}
    assert others <= known, others


def test_a_daemon_counts_the_checks_it_answered_from_memory(daemon: Daemon) -> None:
    assert remembered_metric(daemon) == 0
    assert hammer(daemon, LIMIT + 1) == ["allow"] * LIMIT + ["deny"]  # the store's answers
    assert remembered_metric(daemon) == 0
    assert set(hammer(daemon, 50)) == {"deny"}
    assert remembered_metric(daemon) == 50


# -- two daemons racing -----------------------------------------------------------------

PROCESSES = 2
WAVES = 20
WAVE = 10  # concurrent attempts of one process at a time


async def _attempts(url: str, policy: str, barrier: Any, worker: int) -> dict[str, Any]:
    store = store_from_url(url, timeout_ms=20_000)
    try:
        engine = Engine(parse_policy(policy.encode()), store)
        await store.start()  # connected, the script loaded, before the race starts
        barrier.wait(timeout=60)
        decisions = []
        for wave in range(WAVES):
            calls = [Call("alice", "terminal", f"w{worker}-{wave}-{i}") for i in range(WAVE)]
            decisions += await asyncio.gather(*(engine.check(call) for call in calls))
            await asyncio.sleep(0)  # let the other daemon's attempts interleave
    finally:
        await store.close()
    return {
        "admitted": sum(d.allowed for d in decisions),
        "degraded": sum(d.degraded for d in decisions),
        "remembered": engine.refusals.hits,
    }


def _daemon(url: str, policy: str, barrier: Any, results: Any, worker: int) -> None:
    try:
        results.put(asyncio.run(_attempts(url, policy, barrier, worker)))
    except BaseException:
        results.put(traceback.format_exc())


@pytest.mark.timeout(180)
def test_two_daemons_never_admit_more_than_the_limit(redis_url: str) -> None:
    outcomes, exit_codes = race(_daemon, (redis_url, POLICY), PROCESSES)
    for outcome in outcomes:
        assert isinstance(outcome, dict), outcome
    assert exit_codes == [0] * PROCESSES
    assert sum(o["degraded"] for o in outcomes) == 0
    assert sum(o["admitted"] for o in outcomes) == LIMIT  # exactly: never more, never fewer
    # Each daemon answered from its own memory once it had seen a refusal itself.
    assert all(o["remembered"] > 0 for o in outcomes), outcomes
    assert sum(o["remembered"] for o in outcomes) < PROCESSES * WAVES * WAVE - LIMIT


def test_the_commandstats_count_sees_scripts(redis_server: RedisServer, redis_url: str) -> None:
    """The measure above can fail: one EVALSHA run is one more `evalsha` call."""
    client = redis.Redis.from_url(redis_url)
    try:
        sha = client.script_load("return 1")
        with Commandstats(redis_server) as stats:
            before = stats.read()
            client.evalsha(sha, 0)
            after = stats.read()
    finally:
        client.close()
    assert delta(before, after, SCRIPTS) == 1
    assert delta(before, after) == 1
