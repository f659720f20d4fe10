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
   what the earlier slots committed (counters.lua `release`: the exact inverse of each
   commit) and answer the refusal.
4. Write the call record (if the call is named or holds something) in its slot.

A single-slot call without a record is one script call, like the single-node store. The
clock of each counter is the node that owns its slot (Redis `TIME`), or the injected
clock in tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

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
    decode_holds,
)
from ratewarden.limiter.reference import results_from
from ratewarden.store.base import StoreError
from ratewarden.store.keys import DENIALS_KEY
from ratewarden.store.redis_store import COUNTERS_LUA, REDIS_ERRORS, RedisKeyspace, store_errors

log = logging.getLogger("ratewarden.store")

_OK, _BLOCKED, _REPLAYED, _CONFLICT, _IN_FLIGHT = 0, 1, 2, 3, 4
_NUMBERS = 5  # per op, as `decide` returns them: admitted, used, retry, reset, reserved
_GROUP = 8  # per op from `group`: the five numbers, committed, two undo tokens
# A pending marker outlives any check that is still making progress: each round trip is
# bounded by the socket timeout, and a check makes at most a few per slot it touches.
MIN_PENDING_TTL_MS = 5_000
# Script calls in flight at once per store. redis-py's cluster client fails a command
# outright (MaxConnectionsError) when a node has no free connection, where the
# single-node client would open another; so calls queue here instead, under the store's
# deadline, and each node gets twice this many connections (the other commands).
MAX_IN_FLIGHT = 256
SCRIPT_SHA = hashlib.sha1(COUNTERS_LUA.encode()).hexdigest()


class URLProblem(ValueError):
    """A malformed sentinel or cluster URL (the factory turns it into StoreURLError)."""


def parse_hosts(netloc: str, default_port: int) -> tuple[list[tuple[str, int]], str, str]:
    """`[user[:password]@]host1:port1,host2:port2` -> ([(host, port)], user, password).

    Hosts may be IPv6 literals in brackets (`[::1]:7000`); user and password are
    percent-decoded.
    """
    userinfo, _, hostlist = netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    hosts = []
    for part in hostlist.split(","):
        item = part.strip()
        if not item:
            raise URLProblem("empty host in the host list")
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            port_text = rest.removeprefix(":")
        elif item.count(":") == 1:
            host, _, port_text = item.partition(":")
        elif ":" in item:
            raise URLProblem(f"IPv6 hosts need brackets: [{item}]")
        else:
            host, port_text = item, ""
        try:
            port = int(port_text) if port_text else default_port
        except ValueError:
            raise URLProblem(f"bad port {port_text!r} for host {host!r}") from None
        if not host or not 0 < port < 65_536:
            raise URLProblem(f"bad host {item!r}")
        hosts.append((host, port))
    return hosts, unquote(user), unquote(password)


def cluster_store_from_url(
    url: str, description: str, *, timeout_ms: int = 100, clock: Clock | None = None
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
    return ClusterStore(client, description, clock, timeout_ms=timeout_ms)


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


def op_args(op: CounterOp) -> list[Any]:
    """The ten values counters.lua reads per op (see its header)."""
    return [
        op.kind.value,
        int(op.role),
        op.limit,
        op.window_ms,
        op.burst,
        op.cost,
        *op.period,
        op.hold_line,
    ]


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
    ) -> None:
        self._client = client
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
            await self._client.script_load(COUNTERS_LUA)
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
            return await self._decide(ops, groups, record, now, taken)
        except BaseException:
            # An error or a cancellation (the store deadline) stopped the call midway:
            # give back what it took, in the background, so the deadline still holds.
            if taken:
                self._spawn(self._give_back(taken, ops, now, record))
            raise

    async def _decide(
        self,
        ops: list[CounterOp],
        groups: list[_Group],
        record: CallRecord | None,
        now: str,
        taken: _Taken,
    ) -> Evaluation:
        call_id = record.call_id if record else ""
        named = record is not None and record.keep
        # 1. Claim a named call's call_id, and look at every slot of a multi-slot call.
        first: list[Awaitable[Any]] = []
        if named and record is not None:
            taken.claim = True
            first.append(self._claim(record, now, taken.nonce))
        looked = self.precheck and len(groups) > 1
        if looked:
            first.extend(self._group(g, ops, now, call_id, dry=True) for g in groups)
        found = list(await asyncio.gather(*first)) if first else []
        if named:
            claim: list[int] = found.pop(0)
            if claim[0] != _OK:
                taken.claim = False  # not ours: another check's record
                if claim[0] == _CONFLICT:
                    return Evaluation(conflict=True)
                return Evaluation(results_from(ops, claim[1:]), replayed=True)
        if looked and any(look.blocked for look in found):
            await self._unclaim(record, taken)
            return Evaluation(results_from(ops, merge(len(ops), (r.numbers for r in found))))
        # 2. Commit slot by slot, in slot order.
        replies: list[_Reply] = []
        for group in groups:
            taken.uncertain_holds.append([i for i in group.indices if ops[i].kind in HOLDING])
            reply = await self._group(group, ops, now, call_id, dry=False)
            taken.uncertain_holds.pop()
            replies.append(reply)
            if reply.blocked:
                break
            taken.certain.append(reply.committed)
        if replies and replies[-1].blocked:
            # 3. A slot refused after all (another call took its last unit since the
            # look): give back the earlier slots, and look at the slots not reached, so
            # that every refusing rule is reported.
            fresh = await self._give_back_committed(taken, ops, now, call_id)
            later = [
                await self._group(g, ops, now, call_id, dry=True) for g in groups[len(replies) :]
            ]
            await self._unclaim(record, taken)
            parts = [*(r.numbers for r in replies), *(r.numbers for r in later), fresh]
            return Evaluation(results_from(ops, merge(len(ops), parts)))
        numbers = merge(len(ops), (r.numbers for r in replies))
        # 4. Record the allowed call; the record lists what it holds, for its settle.
        held = sorted(i for r in replies for i, _, _ in r.committed if ops[i].hold_line)
        if record is not None and (record.keep or held):
            taken.claim = True  # from here on the record may be ours
            outcome = await self._run(
                [record.key],
                [
                    "record",
                    now,
                    taken.nonce,
                    record.fingerprint,
                    ",".join(str(int(n)) for n in numbers),
                    "\n".join(ops[i].hold_line for i in held),
                    record.ttl_ms,
                    "1" if record.keep else "0",
                ],
            )
            if outcome[0] != _OK:  # our claim expired and another check recorded the call
                taken.claim = False
                await self._give_back_committed(taken, ops, now, call_id)
                if outcome[0] == _REPLAYED:
                    return Evaluation(results_from(ops, outcome[1:]), replayed=True)
                raise StoreError(f"call_id {call_id!r} is being decided by another check")
        taken.certain.clear()
        taken.claim = False
        return Evaluation(results_from(ops, numbers))

    async def _claim(self, record: CallRecord, now: str, nonce: str) -> list[int]:
        """Hold the call_id while the call is decided: {0} held, else claim's answer.

        A check of the same call_id already in flight is waited for, at most the store
        timeout; it is then replayed (it was allowed) or decided afresh (it was not).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        delay = 0.002
        args = ["claim", now, record.call_id, record.fingerprint, nonce, self.pending_ttl_ms]
        while True:
            reply = await self._run([record.key], args)
            if reply[0] != _IN_FLIGHT:
                return reply
            if loop.time() + delay > deadline:
                raise StoreError(f"call_id {record.call_id!r} is being decided by another check")
            await asyncio.sleep(delay)
            delay = min(2 * delay, 0.02)

    async def _unclaim(self, record: CallRecord | None, taken: _Taken) -> None:
        if record is not None and taken.claim:
            await self._run([record.key], ["unclaim", "", taken.nonce])
        taken.claim = False

    async def _group(
        self, group: _Group, ops: list[CounterOp], now: str, call_id: str, *, dry: bool
    ) -> _Reply:
        """Run one slot's ops: evaluate, and unless `dry`, commit them if none refuses."""
        args: list[Any] = ["group", now, "1" if dry else "0", call_id]
        for i in group.indices:
            args += op_args(ops[i])
        reply = await self._run([ops[i].key for i in group.indices], args)
        found = _Reply(reply[0] == _BLOCKED, {})
        for k, i in enumerate(group.indices):
            values = reply[1 + k * _GROUP : 1 + (k + 1) * _GROUP]
            found.numbers[i] = values[:_NUMBERS]
            if values[5]:
                found.committed.append((i, values[6], values[7]))
        return found

    async def _release(
        self, ops: list[CounterOp], items: Sequence[tuple[int, int, int]], now: str, call_id: str
    ) -> dict[int, list[int]]:
        """Take back what one slot's commit took; the counters' numbers afterwards."""
        if not items:
            return {}
        args: list[Any] = ["release", now, call_id]
        for i, undo, undo2 in items:
            args += [*op_args(ops[i]), undo, undo2]
        reply = await self._run([ops[i].key for i, _, _ in items], args)
        return {i: reply[k * _NUMBERS : (k + 1) * _NUMBERS] for k, (i, _, _) in enumerate(items)}

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

    async def read_holds(self, record_key: str) -> list[Hold] | None:
        with store_errors():
            found: list[bytes | str | None] = await self._client.hmget(record_key, ["s", "h"])
        if found[0] is None or found[0] == b"pending":
            return None
        holds = found[1] or b""
        return decode_holds(holds.decode() if isinstance(holds, bytes) else holds)

    async def settle(
        self, record_key: str, call_id: str, actual: int | None, holds: Sequence[Hold]
    ) -> tuple[int, list[int]]:
        """Mark the record settled first (so a settle counts once), then each slot's holds.

        If the holds cannot be reached after the mark, the call is as if never settled:
        its reservations are charged at their estimate when they expire, its slots are
        reclaimed when their leases end.
        """
        now = self._now()
        status = (await self._run([record_key], ["settle_mark", now]))[0]
        if status != _OK:
            return status, []
        charged = [0] * len(holds)
        actual_arg = "" if actual is None else actual

        async def one(group: _Group) -> None:
            args: list[Any] = ["settle_holds", now, call_id, actual_arg]
            for i in group.indices:
                hold = holds[i]
                args += (hold.kind.value, hold.estimate, *hold.period)
            reply = await self._run([holds[i].key for i in group.indices], args)
            for k, i in enumerate(group.indices):
                charged[i] = reply[k]

        await asyncio.gather(*(one(g) for g in slot_groups(h.key for h in holds)))
        return _OK, charged

    # -- administration ------------------------------------------------------------

    async def push_denials(self, entries: Sequence[str], keep: int) -> None:
        with store_errors():
            await self._client.lpush(DENIALS_KEY, *entries)
            await self._client.ltrim(DENIALS_KEY, 0, keep - 1)

    async def close(self) -> None:
        if self._background:  # let interrupted calls finish giving back, briefly
            await asyncio.wait(self._background, timeout=max(1.0, 10 * self._timeout_s))
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
                        SCRIPT_SHA, len(keys), *keys, *args
                    )
                except NoScriptError:  # this node restarted, failed over or joined:
                    # EVAL runs the script there and caches it, whatever the other nodes do
                    reply = await self._client.eval(COUNTERS_LUA, len(keys), *keys, *args)
        return reply
