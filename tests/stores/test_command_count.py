"""One round trip per decision: the client sends exactly one EVALSHA, whatever the rules.

A raw MONITOR connection to the real redis-server records every command in execution
order. Commands run inside the script are reported as from `[<db> lua]` and are left
out: only what the store's own connection sends is counted. ECHO markers from a
separate connection delimit each measurement.

The one EVALSHA runs the counters script in `decide` mode: KEYS[1] is the call's record and
one counter key per rule follows; ARGV is 'decide', now, dry, call_id, fingerprint,
record TTL, named, then ten values per rule (see the script's header).
"""

from __future__ import annotations

import itertools
import queue
import re
import socket
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pytest
import redis
import redis.asyncio as aioredis

from ratewarden.calls import Call
from ratewarden.engine import Engine
from ratewarden.limiter.ops import CallRecord, CounterOp, Evaluation, Hold, Kind, Role
from ratewarden.limiter.script import SettleStatus
from ratewarden.policy import parse_policy
from ratewarden.store.keys import record_key
from ratewarden.store.redis_store import RedisStore
from ratewarden.vocabulary import CallKind
from ratewarden.wire.bodies import ModelUsage
from tests.helpers.redis_server import RedisServer

pytestmark = pytest.mark.redis

_LINE = re.compile(r"^\+\d+\.\d+ \[\d+ (?P<client>[^\]]+)\] (?P<args>.*)$")
_ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')

Command = tuple[str, ...]  # (client, COMMAND, arg, ...)

POLICY = b"""
version: 1
rules:
  - {name: all-tools, rate: 100/minute}
  - {name: t3-a, match: {tool: [t3, t6]}, rate: 100/minute, algorithm: token_bucket}
  - {name: t3-b, match: {tool: [t3, t6]}, rate: 100/minute, algorithm: fixed_window}
  - {name: t6-a, match: {tool: t6}, per: [user, tool], rate: 2/minute}
  - {name: t6-b, match: {tool: t6}, per: [], rate: 100/hour, algorithm: token_bucket}
  - {name: t6-c, match: {tool: t6}, per: [tool], rate: 100/day, algorithm: fixed_window}
"""
# Each rule's kind, in policy order, as ARGV names it.
KINDS = {"t1": ["sw"], "t3": ["sw", "tb", "fw"], "t6": ["sw", "tb", "fw", "sw", "tb", "fw"]}
HEADER = 7  # 'decide', now, dry, call_id, fingerprint, record TTL, named
PER_OP = 10


def parse_monitor_line(line: str) -> Command | None:
    found = _LINE.match(line)
    if not found:
        return None
    args = _ARG.findall(found["args"])
    return (found["client"], args[0].upper(), *args[1:])


class Monitor:
    """MONITOR on a raw socket, read by a thread; `between()` returns one marked span."""

    def __init__(self, server: RedisServer) -> None:
        self._sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        self._sock.sendall(b"MONITOR\r\n")
        self._file = self._sock.makefile("rb")
        assert self._file.readline() == b"+OK\r\n"
        self._lines: queue.Queue[str] = queue.Queue()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        self._marker = redis.Redis(port=server.port)
        self._ids = itertools.count()

    def _read(self) -> None:
        try:
            for raw in self._file:
                self._lines.put(raw.decode("utf-8", "backslashreplace").rstrip("\r\n"))
        except (OSError, ValueError):
            pass  # closed by close()

    def mark(self) -> str:
        marker = f"rw-test-marker-{next(self._ids)}"
        self._marker.echo(marker)
        return marker

    def between(self, begin: str, end: str, scripts: bool = False) -> list[Command]:
        """Client commands after ECHO `begin` and before ECHO `end`, and with `scripts` the
        commands the scripts ran (else left out)."""
        commands: list[Command] = []
        started = False
        while True:
            parsed = parse_monitor_line(self._lines.get(timeout=10))
            if parsed is None:
                continue
            client, name, *args = parsed
            if name == "ECHO" and args == [begin]:
                started = True
            elif name == "ECHO" and args == [end]:
                assert started, "end marker before begin marker"
                return commands
            elif started and (scripts or not client.endswith("lua")):
                commands.append(parsed)

    def close(self) -> None:
        self._marker.close()
        self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(timeout=5)


@pytest.fixture
def monitor(redis_server: RedisServer, redis_url: str) -> Iterator[Monitor]:
    watcher = Monitor(redis_server)
    yield watcher
    watcher.close()


@contextmanager
def recording(monitor: Monitor, scripts: bool = False) -> Iterator[list[Command]]:
    """Collect the commands sent inside the `with` block (filled in on exit); with
    `scripts`, the commands the scripts ran too."""
    found: list[Command] = []
    begin = monitor.mark()
    yield found
    found.extend(monitor.between(begin, monitor.mark(), scripts))


async def started_store(url: str, cls: type[RedisStore] = RedisStore) -> RedisStore:
    store = cls(aioredis.Redis.from_url(url), url)  # no clock: Redis TIME, as in production
    await store.start()
    return store


def names_and_numkeys(commands: Sequence[Command]) -> list[tuple[str, ...]]:
    """(COMMAND, numkeys) for EVALSHA, (COMMAND,) for anything else."""
    return [(c[1], c[3]) if c[1] == "EVALSHA" else (c[1],) for c in commands]


@pytest.mark.parametrize(("tool", "rules"), [("t1", 1), ("t3", 3), ("t6", 6)])
async def test_one_evalsha_per_decision(
    monitor: Monitor, redis_url: str, tool: str, rules: int
) -> None:
    store = await started_store(redis_url)
    try:
        # Each check goes to the store: a remembered refusal runs no script at all
        # (tests/stores/test_refusal_cache_redis.py).
        engine = Engine(parse_policy(POLICY), store, remember_refusals=False)
        decisions = []
        with recording(monitor) as commands:
            for i in range(4):  # with tool t6 the last two are refused (t6-a: 2/minute)
                decisions.append(await engine.check(Call(user="u", tool=tool, call_id=str(i))))
    finally:
        await store.close()
    assert [len(d.limits) for d in decisions] == [rules] * 4
    expected_decisions = ["allow"] * 4 if rules < 6 else ["allow", "allow", "deny", "deny"]
    assert [d.decision for d in decisions] == expected_decisions
    # One EVALSHA per decision, refused or not: the record's key and one key per rule.
    assert names_and_numkeys(commands) == [("EVALSHA", str(1 + rules))] * 4
    assert len({c[0] for c in commands}) == 1  # all from the store's one connection
    for i, command in enumerate(commands):
        sha, numkeys, *rest = command[2:]
        assert sha == store._script.sha
        keys, argv = rest[: int(numkeys)], rest[int(numkeys) :]
        assert keys[0] == record_key(str(i))
        assert all(key.startswith("rw:{") for key in keys[1:])
        # Redis TIME, not a dry run; the caller named the call, so it is recorded for 1 h.
        assert argv[:HEADER] == ["decide", "", "0", str(i), f"u|{tool}", "3600000", "1"]
        assert len(argv) == HEADER + PER_OP * rules
        assert argv[HEADER::PER_OP] == KINDS[tool]


async def test_only_a_named_call_has_its_record_read(monitor: Monitor, redis_url: str) -> None:
    """A check of a call_id the caller chose may be a replay: the script reads its record
    first. An id the daemon made up is new by construction: the script reads nothing but
    the counters (and records nothing for a call that holds nothing)."""
    store = await started_store(redis_url)
    try:
        engine = Engine(parse_policy(POLICY), store, remember_refusals=False)
        with recording(monitor, scripts=True) as named:
            await engine.check(Call(user="u", tool="t1", call_id="mine"))
        with recording(monitor, scripts=True) as unnamed:
            made_up = await engine.check(Call(user="u", tool="t1", call_id="rw-1", named=False))
    finally:
        await store.close()
    assert made_up.decision == "allow"
    in_script = [(c[1], c[2]) for c in named if c[0].endswith("lua") and c[1] != "TIME"]
    assert ("HMGET", record_key("mine")) in in_script
    assert ("HSET", record_key("mine")) in in_script  # recorded for its replays
    touched = {c[2] for c in unnamed if c[0].endswith("lua") and c[1] != "TIME"}
    assert record_key("rw-1") not in touched
    assert touched  # its counter, and nothing else:
    assert all(key.startswith("rw:{") for key in touched)


async def test_usage_and_unmatched_calls(monitor: Monitor, redis_url: str) -> None:
    store = await started_store(redis_url)
    try:
        engine = Engine(parse_policy(POLICY), store)
        with recording(monitor) as usage_commands:
            usage = await engine.usage("u", tool="t6")
        no_rules = Engine(parse_policy(b"version: 1\nrules: []\n"), store)
        with recording(monitor) as unmatched_commands:
            decision = await no_rules.check(Call(user="u", tool="t6", call_id="x"))
    finally:
        await store.close()
    assert len(usage) == 6
    assert names_and_numkeys(usage_commands) == [("EVALSHA", "7")]
    argv = usage_commands[0][4 + 7 :]
    # A dry run, with no record: no call_id, nothing kept.
    assert argv[:HEADER] == ("decide", "", "1", "", "", "0", "0")
    assert len(argv) == HEADER + PER_OP * 6
    assert decision.decision == "allow"
    assert unmatched_commands == []  # nothing to count, nothing sent


class ChattyStore(RedisStore):
    """A store that sends one command too many per decision: the check must notice."""

    async def evaluate(
        self, ops: Sequence[CounterOp], record: CallRecord | None = None, dry_run: bool = False
    ) -> Evaluation:
        await self._client.exists(*[op.key for op in ops])
        return await super().evaluate(ops, record, dry_run)


class RestartingStore(RedisStore):
    """A store that forgets its script SHA, as if Redis had flushed its script cache."""

    async def evaluate(
        self, ops: Sequence[CounterOp], record: CallRecord | None = None, dry_run: bool = False
    ) -> Evaluation:
        await self._client.script_flush()
        return await super().evaluate(ops, record, dry_run)


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        (ChattyStore, [("EXISTS",), ("EVALSHA", "4")] * 2),
        # NOSCRIPT: the store reloads the script and retries, once.
        (RestartingStore, [("SCRIPT",), ("EVALSHA", "4"), ("SCRIPT",), ("EVALSHA", "4")] * 2),
    ],
    ids=["extra-command", "script-reload"],
)
async def test_the_monitor_sees_every_extra_command(
    monitor: Monitor, redis_url: str, cls: type[RedisStore], expected: list[tuple[str, ...]]
) -> None:
    store = await started_store(redis_url, cls)
    try:
        engine = Engine(parse_policy(POLICY), store)
        # Twice first, so that every connection the store uses is open (a new one says
        # HELLO; the script keeps the first it gets): recorded is what each decision sends.
        for i in range(2):
            await engine.check(Call(user="warm-up", tool="t3", call_id=f"warm-up-{i}"))
        with recording(monitor) as commands:
            for i in range(2):
                decision = await engine.check(Call(user="u", tool="t3", call_id=str(i)))
                assert decision.decision == "allow"
    finally:
        await store.close()
    assert names_and_numkeys(commands) == expected
    assert names_and_numkeys(commands) != [("EVALSHA", "4")] * 2


def test_monitor_line_parsing() -> None:
    line = '+1700000000.123456 [0 127.0.0.1:5555] "EVALSHA" "ab\\"c" "1" "rw:{x|u=a}:sw"'
    assert parse_monitor_line(line) == ("127.0.0.1:5555", "EVALSHA", 'ab\\"c', "1", "rw:{x|u=a}:sw")
    assert parse_monitor_line('+1700000000.123456 [0 lua] "GETRANGE" "k" "0" "7"') == (
        "lua",
        "GETRANGE",
        "k",
        "0",
        "7",
    )
    assert parse_monitor_line("+OK") is None


CONNECTING = {"HELLO", "CLIENT", "SELECT"}  # a new pooled connection's own greeting
# Commands that change the keyspace, as the counters script may run them.
WRITES = {"SET", "HSET", "HDEL", "DEL", "PEXPIRE", "ZADD", "ZREM", "INCRBY"}
TWO_BUDGETS = b"""
version: 1
defaults: {timezone: UTC}
rules:
  - {name: per-user, per: [user], budget: 5.00/day}
  - {name: per-team, per: [team], budget: 50.00/day}
  - {name: all-tools, rate: 100/minute}
"""


async def settle_commands(
    monitor: Monitor, url: str, retention_days: int, call_id: str
) -> tuple[list[Command], list[Command], list[Command]]:
    """What the store's connection sends for one check and its settle, and the commands
    the scripts ran for each, with `retention_days` of spend history."""
    store = RedisStore(aioredis.Redis.from_url(url), url, None, retention_days)
    await store.start()
    try:
        engine = Engine(parse_policy(TWO_BUDGETS), store, remember_refusals=False)
        with recording(monitor, scripts=True) as check:
            call = Call(user=call_id, tool="t1", call_id=call_id, team=call_id, cost=0.25)
            assert (await engine.check(call)).allowed
        with recording(monitor, scripts=True) as settle:
            assert (await engine.settle(call_id, 0.20)).outcome == "settled"
    finally:
        await store.close()
    sent = [c for c in settle if not c[0].endswith("lua") and c[1] not in CONNECTING]
    in_script = [c for c in settle if c[0].endswith("lua")]
    return [c for c in check if c[0].endswith("lua")], sent, in_script


async def test_a_settle_costs_one_more_write_per_budget_and_a_check_none(
    monitor: Monitor, redis_url: str
) -> None:
    """Spend history, counted: with it off (0 days: the script as it was before spend
    records), a settle of a call under two budgets ran N writes; with it on, N + 2 (one
    SET per budget charged) and two GETs, in the same one script call. The check that
    reserved writes exactly the same commands either way."""
    check_off, sent_off, settle_off = await settle_commands(monitor, redis_url, 0, "off")
    check_on, sent_on, settle_on = await settle_commands(monitor, redis_url, 90, "on")
    assert names_and_numkeys(sent_on) == names_and_numkeys(sent_off)  # one round trip each:
    assert [c[1] for c in sent_on] == ["HMGET", "EVALSHA"]  # read the holds, then settle

    def writes(commands: list[Command]) -> list[str]:
        # Not PEXPIRE: a budget's TTL is stretched only when it must grow, which depends
        # on the milliseconds between the check and the settle, not on spend history.
        return [c[1] for c in commands if c[1] in WRITES - {"PEXPIRE"}]

    assert writes(check_on) == writes(check_off)  # nothing more on the decision path
    assert [c[1] for c in check_on] == [c[1] for c in check_off]
    assert len(writes(settle_on)) == len(writes(settle_off)) + 2
    extra = [c for c in settle_on if len(c) > 2 and c[2].startswith("rw:spend:")]
    assert [c[1] for c in extra] == ["GET", "SET", "GET", "SET"]
    assert {c[2].split(":")[2] for c in extra} == {"{per-user|user=on}", "{per-team|team=on}"}
    assert all(c[4] == "PX" for c in extra if c[1] == "SET")
    assert [c[3] for c in extra if c[1] == "SET"] == ["200000", "200000"]


async def test_a_token_rate_is_one_evalsha_at_check_and_one_at_settle(
    monitor: Monitor, redis_url: str
) -> None:
    """A token rate beside a rate rule: the check is one EVALSHA that reads the window
    (one GET) and writes nothing of it; the settle, after reading the holds, is one
    EVALSHA whose script reads the window and writes it once (GET, SET)."""
    tokens = "rw:{tokens|user=u}:tk"
    rate = "rw:{calls|user=u}:sw"
    store = await started_store(redis_url)
    try:
        ops = [
            CounterOp(rate, Kind.SLIDING_WINDOW, Role.ENFORCE, 10, 60_000),
            CounterOp(tokens, Kind.TOKENS, Role.ENFORCE, 1_000, 60_000, rule="tokens"),
        ]
        record = CallRecord(record_key("tk-1"), "tk-1", "fp", 60_000, False)
        with recording(monitor, scripts=True) as check:
            assert (await store.evaluate(ops, record)).results[1].admitted
        with recording(monitor, scripts=True) as settle:
            found = await store.read_holds(record_key("tk-1"))
            assert found is not None
            holds = [Hold(h.kind, h.key, 321, h.rule, (1_000, 60_000, 0)) for h in found.holds]
            settled = await store.settle(record_key("tk-1"), "tk-1", None, holds, "fp")
            assert settled == (SettleStatus.SETTLED, [0])
    finally:
        await store.close()
    sent = [c for c in check if not c[0].endswith("lua") and c[1] not in CONNECTING]
    assert names_and_numkeys(sent) == [("EVALSHA", "3")]
    on_tokens = [c[1] for c in check if c[0].endswith("lua") and tokens in c]
    assert on_tokens == ["GET"]  # read, never written at check
    sent = [c for c in settle if not c[0].endswith("lua") and c[1] not in CONNECTING]
    assert names_and_numkeys(sent) == [("HMGET",), ("EVALSHA", "2")]
    on_tokens = [c[1] for c in settle if c[0].endswith("lua") and tokens in c]
    assert on_tokens == ["GET", "SET"]


MODEL_BUDGETS = b"""
version: 1
defaults: {timezone: UTC}
models:
  "house-*": {input: 2, output: 8}
rules:
  - {name: per-user, match: {kind: any}, per: [user], budget: 5.00/day}
  - {name: per-team, match: {kind: any}, per: [team], budget: 50.00/day}
"""


async def test_a_model_calls_settle_writes_its_model_spend_in_the_same_script_call(
    monitor: Monitor, redis_url: str
) -> None:
    """A model call under two budgets: its settle is still HMGET then one EVALSHA, whose
    script runs, beside each budget's day record (GET, SET), its model record (GET,
    SET ... PX): two writes more than a tool call's settle; a tool call's, none."""
    store = RedisStore(aioredis.Redis.from_url(redis_url), redis_url, None, 90)
    await store.start()
    try:
        engine = Engine(parse_policy(MODEL_BUDGETS), store, remember_refusals=False)
        model = Call(user="mu", tool="house-7", call_id="mc", team="mt", kind=CallKind.MODEL,
                     input_tokens=1000, max_output_tokens=1000)  # fmt: skip
        assert (await engine.check(model)).allowed
        with recording(monitor, scripts=True) as settle:
            usage = ModelUsage(input_tokens=1000, output_tokens=500)
            assert (await engine.settle("mc", usage=usage)).outcome == "settled"
        tool = Call(user="tu", tool="t1", call_id="tc", team="tt", cost=0.25)
        assert (await engine.check(tool)).allowed
        with recording(monitor, scripts=True) as tool_settle:
            assert (await engine.settle("tc", 0.20)).outcome == "settled"
    finally:
        await store.close()
    sent = [c for c in settle if not c[0].endswith("lua") and c[1] not in CONNECTING]
    assert [c[1] for c in sent] == ["HMGET", "EVALSHA"]  # one round trip to settle
    spend = [c for c in settle if len(c) > 2 and c[2].startswith("rw:spend:")]
    records = [(c[1], c[2].split("}:")[1]) for c in spend]
    day = records[0][1]
    assert records == [("GET", day), ("SET", day), ("GET", day + ":m"), ("SET", day + ":m")] * 2
    assert [c[3] for c in spend if c[1] == "SET"] == ["6000"] * 4  # 1000 x 2 + 500 x 8
    assert not [c for c in tool_settle if len(c) > 2 and c[2].endswith(":m")]
