"""Redis Cluster (`redis+cluster://host1:7000,host2:7001`): counters spread over hash slots.

Every key of one counter shares its hash tag (see keys.py), but the counters of one call
usually sit in different slots, often on different nodes, and a Lua script can only
touch one slot. So a call is decided slot by slot, and all or nothing is kept by a
protocol rather than by one script (docs/cluster.md has the design and its worst cases):

1. Claim the call_id in its record's slot (named calls only), with a pending marker, and
   at the same time look at every slot without writing (a dry run; only when the call
   spans several slots). A replay or a conflict ends here; so does a refusal, which has
   then written nothing anywhere.
2. Commit slot by slot, in ascending slot order: each slot's script evaluates its
   counters again and commits them only if none of its enforcing ops refuses.
3. If a slot refuses now (another call took the last unit between 1 and 2), take back
   what the earlier slots committed (cluster.lua `release`: the exact inverse of each
   commit) and answer the refusal.
4. Write the call record (if the call is named or holds something) in its slot.

A single-slot call without a record is one script call, like the single-node store. The
clock of each counter is the node that owns its slot (Redis `TIME`), or the injected
clock in tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.crc import key_slot
from redis.exceptions import NoScriptError

from ratewarden.clock import Clock
from ratewarden.limiter.ops import (
    HOLDING,
    CallRecord,
    CounterOp,
    Evaluation,
    Hold,
    Recorded,
)
from ratewarden.limiter.script import (
    GROUP_NUMBERS,
    NUMBERS,
    RECORD_FIELDS,
    SPEND_RETENTION_DAYS,
    ScriptMode,
    SettleStatus,
    Status,
    evaluation_of,
    hold_keys,
    hold_values,
    op_values,
    recorded,
    results_from,
    settle_head,
    sha,
    source,
)
from ratewarden.store.base import StoreError
from ratewarden.store.keys import DENIALS_KEY
from ratewarden.store.redis_store import REDIS_ERRORS, RedisKeyspace, store_errors
from ratewarden.store.urls import URLProblem, parse_hosts

log = logging.getLogger("ratewarden.store")

# A pending marker outlives any check that is still making progress: each round trip is
# bounded by the socket timeout, and a check makes at most a few per slot it touches.
MIN_PENDING_TTL_MS = 5_000
# Script calls in flight at once per store. redis-py's cluster client fails a command
# outright (MaxConnectionsError) when a node has no free connection, where the
# single-node client would open another; so calls queue here instead, under the store's
# deadline, and each node gets twice this many connections (the other commands).
MAX_IN_FLIGHT = 256


def cluster_store_from_url(
    url: str,
    description: str,
    *,
    timeout_ms: int = 100,
    clock: Clock | None = None,
    spend_retention_days: int = SPEND_RETENTION_DAYS,
) -> ClusterStore:
    """`redis+cluster://[[user]:password@]host1:7000,host2:7001[/0]`: startup nodes."""
    parts = urlsplit(url)
    hosts, user, password = parse_hosts(parts.netloc, 6379)
    db = parts.path.strip("/")
    if db not in ("", "0"):
        raise URLProblem("Redis Cluster has only database 0")
    if parse_qs(parts.query):
        raise URLProblem(f"unknown options {parts.query!r}")
    timeout = timeout_ms / 1000
    client = RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in hosts],
        username=user or None,
        password=password or None,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        decode_responses=False,
        max_connections=2 * MAX_IN_FLIGHT,
    )
    return ClusterStore(
        client,
        description,
        clock,
        timeout_ms=timeout_ms,
        spend_retention_days=spend_retention_days,
    )


@dataclass(frozen=True, slots=True)
class _Group:
    """The ops of one call that live in one hash slot (indices into the call's ops)."""

    slot: int
    indices: tuple[int, ...]


@dataclass(slots=True)
class _Reply:
    """One slot's answer to `group`."""

    blocked: bool
    numbers: dict[int, list[int]]  # op index -> its five numbers
    committed: list[tuple[int, int, int]] = field(default_factory=list)  # (op, undo tokens)


@dataclass(slots=True)
class _Taken:
    """What a call in progress has taken, so it can be given back if the call stops."""

    certain: list[list[tuple[int, int, int]]] = field(default_factory=list)  # committed slots
    # Ops whose commit may or may not have happened (sent, no answer). Only holds are
    # given back there: a reservation or a slot is keyed by the call_id, so releasing one
    # that was never taken is a no-op; a rate unit is not, so it stays counted.
    uncertain_holds: list[list[int]] = field(default_factory=list)
    claim: bool = False  # a pending marker (or the record) may be ours
    nonce: str = field(default_factory=lambda: secrets.token_hex(8))  # ours, not another's

    def __bool__(self) -> bool:
        return bool(self.certain or self.uncertain_holds or self.claim)


def slot_of(key: str) -> int:
    return key_slot(key.encode())


def slot_groups(keys: Iterable[str]) -> list[_Group]:
    """Key indices grouped by hash slot, in ascending slot order (the commit order)."""
    by_slot: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        by_slot.setdefault(slot_of(key), []).append(i)
    return [_Group(slot, tuple(indices)) for slot, indices in sorted(by_slot.items())]


def merge(count: int, parts: Iterable[dict[int, list[int]]]) -> list[int]:
    """The five numbers of every op, in op order; later parts win."""
    by_op: dict[int, list[int]] = {}
    for part in parts:
        by_op.update(part)
    return [n for i in range(count) for n in by_op.get(i, [])]


class _Decision:
    """One call decided on a cluster, one method per step of docs/cluster.md.

    Whatever a step takes is noted in `taken`, so that a call stopped midway (an error,
    the store's deadline) can be given back by the store.
    """

    def __init__(
        self,
        store: ClusterStore,
        ops: list[CounterOp],
        groups: list[_Group],
        record: CallRecord | None,
        now: str,
        taken: _Taken,
    ) -> None:
        self.store, self.ops, self.groups, self.record = store, ops, groups, record
        self.now, self.taken = now, taken
        self.call_id = record.call_id if record else ""

    async def run(self) -> Evaluation:
        early = await self.claim_and_look()
        if early is not None:
            return early
        replies = await self.commit()
        if replies and replies[-1].blocked:
            return await self.give_back(replies)
        return await self.write_record(replies)

    async def claim_and_look(self) -> Evaluation | None:
        """1. Claim a named call's call_id, and look at every slot of a multi-slot call
        (a dry run). A replay, a conflict or a refusal ends the call here."""
        store, record, taken = self.store, self.record, self.taken
        first: list[Awaitable[Any]] = []
        named = record is not None and record.named
        if record is not None and named:
            taken.claim = True
            first.append(store._claim(record, self.now, taken.nonce))
        looked = store.precheck and len(self.groups) > 1
        if looked:
            first.extend(self._look(g) for g in self.groups)
        found = list(await asyncio.gather(*first)) if first else []
        if named:
            claim: list[int] = found.pop(0)
            if claim[0] != Status.ALLOWED:
                taken.claim = False  # not ours: another check's record
                return evaluation_of(self.ops, claim)
        if looked and any(look.blocked for look in found):
            await store._unclaim(record, taken)
            return self._evaluation(r.numbers for r in found)
        return None

    async def commit(self) -> list[_Reply]:
        """2. Commit slot by slot, in slot order, until one refuses."""
        replies: list[_Reply] = []
        for group in self.groups:
            holding = [i for i in group.indices if self.ops[i].kind in HOLDING]
            self.taken.uncertain_holds.append(holding)
            reply = await self.store._group(group, self.ops, self.now, self.call_id, dry=False)
            self.taken.uncertain_holds.pop()
            replies.append(reply)
            if reply.blocked:
                break
            self.taken.certain.append(reply.committed)
        return replies

    async def give_back(self, replies: list[_Reply]) -> Evaluation:
        """3. A slot refused after all (another call took its last unit since the look):
        give back the earlier slots, and look at the slots not reached, so that every
        refusing rule is reported."""
        store = self.store
        fresh = await store._give_back_committed(self.taken, self.ops, self.now, self.call_id)
        later = [await self._look(g) for g in self.groups[len(replies) :]]
        await store._unclaim(self.record, self.taken)
        return self._evaluation([*(r.numbers for r in replies), *(r.numbers for r in later), fresh])

    async def write_record(self, replies: list[_Reply]) -> Evaluation:
        """4. Record the allowed call; the record lists what it holds, for its settle."""
        numbers = merge(len(self.ops), (r.numbers for r in replies))
        held = sorted(i for r in replies for i, _, _ in r.committed if self.ops[i].hold_line)
        record, taken = self.record, self.taken
        if record is not None and (record.named or held):
            taken.claim = True  # from here on the record may be ours
            outcome = await self.store._run([record.key], self._record_args(numbers, held))
            if outcome[0] != Status.ALLOWED:  # our claim expired; another check recorded it
                taken.claim = False
                await self.store._give_back_committed(taken, self.ops, self.now, self.call_id)
                if outcome[0] == Status.REPLAYED:
                    return evaluation_of(self.ops, outcome)
                raise StoreError(f"call_id {self.call_id!r} is being decided by another check")
        taken.certain.clear()
        taken.claim = False
        return Evaluation(results_from(self.ops, numbers))

    def _record_args(self, numbers: list[int], held: list[int]) -> list[Any]:
        record = self.record
        assert record is not None
        return [
            ScriptMode.RECORD.value,
            self.now,
            self.taken.nonce,
            record.fingerprint,
            ",".join(str(int(n)) for n in numbers),
            "\n".join(self.ops[i].hold_line for i in held),
            record.ttl_ms,
            "1" if record.named else "0",
        ]

    def _look(self, group: _Group) -> Awaitable[_Reply]:
        return self.store._group(group, self.ops, self.now, self.call_id, dry=True)

    def _evaluation(self, parts: Iterable[dict[int, list[int]]]) -> Evaluation:
        return Evaluation(results_from(self.ops, merge(len(self.ops), parts)))


class ClusterStore(RedisKeyspace):
    """`redis+cluster://`: one script call per hash slot; see the module docstring."""

    def __init__(
        self,
        client: RedisCluster,
        description: str,
        clock: Clock | None = None,
        *,
        timeout_ms: int = 100,
        precheck: bool = True,
        spend_retention_days: int = SPEND_RETENTION_DAYS,
    ) -> None:
        self._client = client
        self._source = source(spend_retention_days)
        self._sha = sha(self._source)
        self._description = description
        self._clock = clock
        self._timeout_s = timeout_ms / 1000
        self.pending_ttl_ms = max(MIN_PENDING_TTL_MS, 50 * timeout_ms)
        # The dry run before committing a call that spans several slots. Without it, a
        # refused call would commit and give back its other slots every time; tests turn
        # it off to drive every refusal through that path.
        self.precheck = precheck
        self._background: set[asyncio.Task[None]] = set()
        self._in_flight = asyncio.Semaphore(MAX_IN_FLIGHT)

    @property
    def description(self) -> str:
        return self._description

    async def start(self) -> None:
        """Load the script on every primary (a node that lacks it later gets it by EVAL)."""
        try:
            await self._client.script_load(self._source)
        except REDIS_ERRORS as exc:
            raise StoreError(f"cannot load the counters script: {exc}") from exc

    # -- decisions -----------------------------------------------------------------

    async def evaluate(
        self, ops: Sequence[CounterOp], record: CallRecord | None = None, dry_run: bool = False
    ) -> Evaluation:
        ops = list(ops)
        groups = slot_groups(op.key for op in ops)
        now = self._now()
        if dry_run:
            looks = await asyncio.gather(*(self._group(g, ops, now, "", dry=True) for g in groups))
            return Evaluation(results_from(ops, merge(len(ops), (r.numbers for r in looks))))
        taken = _Taken()
        try:
            return await _Decision(self, ops, groups, record, now, taken).run()
        except BaseException:
            # An error or a cancellation (the store deadline) stopped the call midway:
            # give back what it took, in the background, so the deadline still holds.
            if taken:
                self._spawn(self._give_back(taken, ops, now, record))
            raise

    async def _claim(self, record: CallRecord, now: str, nonce: str) -> list[int]:
        """Hold the call_id while the call is decided: {0} held, else claim's answer.

        A check of the same call_id already in flight is waited for, at most the store
        timeout; it is then replayed (it was allowed) or decided afresh (it was not).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        delay = 0.002
        args: list[Any] = [ScriptMode.CLAIM.value, now, record.call_id, record.fingerprint, nonce]
        args.append(self.pending_ttl_ms)
        while True:
            reply = await self._run([record.key], args)
            if reply[0] != Status.IN_FLIGHT:
                return reply
            if loop.time() + delay > deadline:
                raise StoreError(f"call_id {record.call_id!r} is being decided by another check")
            await asyncio.sleep(delay)
            delay = min(2 * delay, 0.02)

    async def _unclaim(self, record: CallRecord | None, taken: _Taken) -> None:
        if record is not None and taken.claim:
            await self._run([record.key], [ScriptMode.UNCLAIM.value, "", taken.nonce])
        taken.claim = False

    async def _group(
        self, group: _Group, ops: list[CounterOp], now: str, call_id: str, *, dry: bool
    ) -> _Reply:
        """Run one slot's ops: evaluate, and unless `dry`, commit them if none refuses."""
        args: list[Any] = [ScriptMode.GROUP.value, now, "1" if dry else "0", call_id]
        for i in group.indices:
            args += op_values(ops[i])
        reply = await self._run([ops[i].key for i in group.indices], args)
        found = _Reply(reply[0] == Status.BLOCKED, {})
        for k, i in enumerate(group.indices):
            values = reply[1 + k * GROUP_NUMBERS : 1 + (k + 1) * GROUP_NUMBERS]
            found.numbers[i] = values[:NUMBERS]
            if values[5]:
                found.committed.append((i, values[6], values[7]))
        return found

    async def _release(
        self, ops: list[CounterOp], items: Sequence[tuple[int, int, int]], now: str, call_id: str
    ) -> dict[int, list[int]]:
        """Take back what one slot's commit took; the counters' numbers afterwards."""
        if not items:
            return {}
        args: list[Any] = [ScriptMode.RELEASE.value, now, call_id]
        for i, undo, undo2 in items:
            args += [*op_values(ops[i]), undo, undo2]
        reply = await self._run([ops[i].key for i, _, _ in items], args)
        return {i: reply[k * NUMBERS : (k + 1) * NUMBERS] for k, (i, _, _) in enumerate(items)}

    async def _give_back_committed(
        self, taken: _Taken, ops: list[CounterOp], now: str, call_id: str
    ) -> dict[int, list[int]]:
        """Release every committed slot, one at a time.

        A release that fails or is interrupted is never sent again for its rate ops
        (they could be taken back twice, and another call's unit with them); its holds
        move to `uncertain_holds`, whose release is safe to repeat.
        """
        fresh: dict[int, list[int]] = {}
        while taken.certain:
            items = taken.certain.pop()
            try:
                fresh.update(await self._release(ops, items, now, call_id))
            except BaseException:
                taken.uncertain_holds.append([i for i, _, _ in items if ops[i].kind in HOLDING])
                raise
        return fresh

    async def _give_back(
        self, taken: _Taken, ops: list[CounterOp], now: str, record: CallRecord | None
    ) -> None:
        """After an interrupted call: release what it took, drop its claim. Best effort."""
        call_id = record.call_id if record else ""
        while taken.certain:  # each failed slot is logged, and the others still tried
            try:
                await self._give_back_committed(taken, ops, now, call_id)
            except Exception as exc:  # what stays taken expires by itself (docs/cluster.md)
                log.warning("cluster store: could not give back an interrupted call: %s", exc)
        for holds in taken.uncertain_holds:
            with contextlib.suppress(StoreError):
                await self._release(ops, [(i, 0, 0) for i in holds], now, call_id)
        taken.uncertain_holds.clear()
        with contextlib.suppress(StoreError):
            await self._unclaim(record, taken)

    def _spawn(self, work: Awaitable[None]) -> None:
        async def run() -> None:
            await work

        task = asyncio.get_running_loop().create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- settling ------------------------------------------------------------------

    async def read_holds(self, record_key: str) -> Recorded | None:
        with store_errors():
            found: list[Any] = await self._client.hmget(record_key, RECORD_FIELDS)
        return recorded(found)

    async def settle(
        self,
        record_key: str,
        call_id: str,
        actual: int | None,
        holds: Sequence[Hold],
        fingerprint: str = "",
        result_digest: str | None = None,
        model: bool = False,
    ) -> tuple[SettleStatus, list[int]]:
        """Mark the record settled first (so a settle counts once), then each slot's holds.

        If the holds cannot be reached after the mark, the call is as if never settled:
        its reservations are charged at their estimate when they expire, its slots are
        reclaimed when their leases end.
        """
        now = self._now()
        mark = [ScriptMode.SETTLE_MARK.value, now, fingerprint]  # only the record the caller read
        status = SettleStatus((await self._run([record_key], mark))[0])
        if status != SettleStatus.SETTLED:
            return status, []
        charged = [0] * len(holds)

        async def one(group: _Group) -> None:
            mode = ScriptMode.SETTLE_HOLDS
            args: list[Any] = settle_head(mode, now, call_id, actual, result_digest, model)
            for i in group.indices:
                args += hold_values(holds[i])
            reply = await self._run(hold_keys([holds[i] for i in group.indices]), args)
            for k, i in enumerate(group.indices):
                charged[i] = reply[k]

        await asyncio.gather(*(one(g) for g in slot_groups(h.key for h in holds)))
        return SettleStatus.SETTLED, charged

    # -- administration ------------------------------------------------------------

    async def sweep_budget(self, key: str, period: tuple[int, int, int]) -> int:
        reply = await self._run([key], [ScriptMode.SWEEP.value, self._now(), *period])
        return int(reply[0])

    async def push_denials(self, entries: Sequence[str], keep: int) -> None:
        with store_errors():
            await self._client.lpush(DENIALS_KEY, *entries)
            await self._client.ltrim(DENIALS_KEY, 0, keep - 1)

    async def _get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """The values of `keys`, which sit in many slots: one MGET per node."""
        values: list[bytes | None] = await self._client.mget_nonatomic(keys)
        return values

    async def close(self) -> None:
        if self._background:  # let interrupted calls finish giving back, briefly
            await asyncio.wait(self._background, timeout=max(1.0, 10 * self._timeout_s))
        # then stop the rest: one still running would reopen connections after the
        # close, and they would leak when the event loop ends
        late = list(self._background)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
        await self._client.aclose()

    # -- plumbing ------------------------------------------------------------------

    def _now(self) -> str:
        return str(self._clock.now_ms()) if self._clock else ""

    async def _run(self, keys: list[str], args: list[Any]) -> list[int]:
        """One script call in the slot of `keys` (all in one slot)."""
        with store_errors():
            async with self._in_flight:
                try:
                    reply: list[int] = await self._client.evalsha(
                        self._sha, len(keys), *keys, *args
                    )
                except NoScriptError:  # this node restarted, failed over or joined:
                    # EVAL runs the script there and caches it, whatever the other nodes do
                    reply = await self._client.eval(self._source, len(keys), *keys, *args)
        return reply
