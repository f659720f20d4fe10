"""Who is blocked: decisions and refusals per user and per rule, for the whole fleet.

Three parts, none of which adds a store round trip to a decision:

- `Tally.count`, called by the observer for every decision: a few increments in this
  process's dicts (no store, no clock). They hold at most `USERS_PER_FLUSH` users (and as
  many (user, rule, tool) triples and rules); past that, the rest is counted under one
  "others" entry, so a flood of distinct users costs no more memory than the cap. A
  user's allowed calls are counted only while the user is watched (refused in the last
  hour, anywhere in the fleet): see `Tally`.
- `ActivityRecorder`, a background task: every `FLUSH_EVERY_S` it takes the tally and adds
  it, in one pipeline (store/redis_activity.py), to the current minute's and the
  current hour's sketches: sorted sets of counts, each trimmed to its `SKETCH_KEEP`
  highest members, the minutes kept two hours and the hours 26 (store/keys.py). So the
  store holds at most (120 + 26) buckets x 5 sketches x `SKETCH_KEEP` members, however
  many users there are. Within a bucket the counts are exact while a sketch holds fewer
  than `SKETCH_KEEP` members; past that, members below the K-th are dropped (a user
  counted again later starts from their new count), and the answers say `approximate`.
  A count lands in the minute of the flush that carries it: up to `FLUSH_EVERY_S` late.
- The reads, for the console (`GET /v1/admin/blocked`, `GET /v1/admin/activity`): the
  buckets of a window read in one pipeline and summed here.

Every daemon and worker flushes into the same buckets, so the figures are the fleet's.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, TypeVar

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from ratewarden.calls import Call
from ratewarden.clock import Clock
from ratewarden.engine import Decision
from ratewarden.service.audit import worded
from ratewarden.service.errors import error_response
from ratewarden.service.stopping import Stopping
from ratewarden.store import Store, StoreError
from ratewarden.store.base import SketchCounts
from ratewarden.store.breaker import CircuitOpenError
from ratewarden.store.keys import HOUR_BUCKET_TTL_MS, MINUTE_BUCKET_TTL_MS, SKETCH_KEEP
from ratewarden.wire.bodies import ErrorResponse, FieldError

log = logging.getLogger("ratewarden.activity")
T = TypeVar("T")

# As often as the overview reads it (console.py's sampler): a flush costs the same
# whatever the traffic, and under callgrind, where the daemon answers a small fraction of
# its usual decisions per second, flushing every second came to 0.8 % of the daemon's
# instructions per decision (bench/instructions.py), every 5 s to 0.4 %.
FLUSH_EVERY_S = 5.0
WATCH_EVERY_MS = 10_000  # how often a process reads whom the fleet refused (the watched)
USERS_PER_FLUSH = 5_000  # distinct users (and triples, rules) a process counts per flush
MINUTE_MS, HOUR_MS = 60_000, 3_600_000
_STOP_WAIT_S = 5.0

# The sketches of each bucket, by what their members are.
DECIDED = "decided"  # user -> decisions
REFUSED = "refused"  # user -> refusals
WHY = "why"  # [user, rule, tool] -> refusals, by the rule whose sentence the call got
RULE_DECIDED = "rule_decided"  # rule -> decisions it applied to
RULE_REFUSED = "rule_refused"  # rule -> refusals it made
OTHERS = "null"  # the member past the in-process cap: JSON null, never a name's JSON

Name = str | None  # None: the others, past the cap


# -- in the decision's process --------------------------------------------------------------


class Tally:
    """This process's counts since the last flush, bounded by `cap` entries each.

    A user's decisions are counted only while the user is `watched`: refused in the last
    hour, here or by any process on the store (`ActivityRecorder` keeps the set). The
    calls of the users never refused, most of them, cost a set lookup here and nothing in
    the store: counting every user's every decision cost the store a sorted-set write per
    user per flush (bench/instructions.py: 16 % more Redis work per decision with 20 000
    users). Every rule's decisions are counted: rules are few."""

    def __init__(self, cap: int = USERS_PER_FLUSH) -> None:
        self.cap = cap
        self.users: dict[Name, list[int]] = {}  # user -> [decisions, refusals]
        self.why: dict[tuple[Name, str, str], int] = {}  # (user, rule, tool) -> refusals
        self.rules: dict[Name, list[int]] = {}  # rule -> [decisions, refusals]
        self.watched: frozenset[str] = frozenset()  # whose decisions are counted
        self.refused: list[str] = []  # the users refused in what was last taken

    def count(self, decision: Decision, call: Call) -> None:
        """One decision: O(its rules), no store, no clock. Written for the common case,
        an allowed call of a user never refused: a subscript per rule (the KeyError only
        on a rule's first call since the flush) and a set lookup (timeit: 0.33 us, where
        a `get` per rule and the refusal test first took 0.48)."""
        rules = self.rules
        for verdict in decision.limits:
            try:
                rules[verdict.rule][0] += 1
            except KeyError:
                self._new_rule(verdict.rule)[0] += 1
        user = call.user
        if decision.decision == "allow":
            if user in self.watched:  # refused lately: every decision of theirs counts
                (self.users.get(user) or self._new_user(user))[0] += 1
            return
        counts = self.users.get(user) or self._new_user(user)
        counts[0] += 1
        counts[1] += 1
        self._refused(decision, call)

    def _new_user(self, user: str) -> list[int]:
        if len(self.users) < self.cap:
            found = self.users[user] = [0, 0]
            return found
        return self.users.setdefault(None, [0, 0])

    def _new_rule(self, name: str) -> list[int]:
        key: Name = name if len(self.rules) < self.cap else None
        return self.rules.setdefault(key, [0, 0])

    def _refused(self, decision: Decision, call: Call) -> None:
        for verdict in decision.violations:
            rule = self.rules.get(verdict.rule) or self._new_rule(verdict.rule)
            rule[1] += 1
            if not any(v.rule == verdict.rule for v in decision.limits):
                rule[0] += 1  # a rule that refused applied to the call, whatever `limits` say
        binding = worded(decision, decision.violations)
        key: tuple[Name, str, str] = (call.user, binding.rule if binding else "", call.tool)
        why = self.why
        if key not in why and len(why) >= self.cap:
            key = (None, "", "")
        why[key] = why.get(key, 0) + 1

    def take(self) -> SketchAdds | None:
        """What was counted since the last take, as the sketches' members; None: nothing.
        The users it refused are left in `refused` until the next take."""
        if not self.users and not self.rules:
            return None
        users, why, rules = self.users, self.why, self.rules
        self.users, self.why, self.rules = {}, {}, {}
        self.refused = [u for u, n in users.items() if n[1] and u is not None]
        return {
            DECIDED: {_member(u): n[0] for u, n in users.items()},
            REFUSED: {_member(u): n[1] for u, n in users.items() if n[1]},
            WHY: {_why_member(k): n for k, n in why.items()},
            RULE_DECIDED: {_member(r): n[0] for r, n in rules.items() if n[0]},
            RULE_REFUSED: {_member(r): n[1] for r, n in rules.items() if n[1]},
        }


SketchAdds = dict[str, dict[str, int]]


def _member(name: Name) -> str:
    return json.dumps(name)


def _why_member(key: tuple[Name, str, str]) -> str:
    return OTHERS if key[0] is None else json.dumps(list(key))


def minute_bucket(now_ms: int) -> str:
    return f"m{now_ms // MINUTE_MS}"


def hour_bucket(now_ms: int) -> str:
    return f"h{now_ms // HOUR_MS}"


class ActivityRecorder:
    """Flushes the tally into the store's sketches every FLUSH_EVERY_S, on the bare store
    with its own deadline (as the fleet's poll): a slow flush never counts against the
    decisions' circuit breaker. A flush the store refuses is dropped (the figures then
    miss that second) and logged once a minute at most."""

    def __init__(self, tally: Tally, store: Store, clock: Clock, timeout_s: float = 1.0) -> None:
        self.tally, self.store, self.clock, self.timeout_s = tally, store, clock, timeout_s
        self._task: asyncio.Task[None] | None = None
        self._stopping = Stopping()
        self._warned_at = -MINUTE_MS
        # Whose decisions the tally counts: the users refused here in the last hour (by
        # their last refusal, oldest first, at most SKETCH_KEEP), and those the store's
        # sketches list as refused this hour or the last (read every WATCH_EVERY_MS).
        self._refused_here: dict[str, int] = {}
        self._refused_anywhere: frozenset[str] = frozenset()
        self._watch_read_at = -WATCH_EVERY_MS

    async def flush(self) -> None:
        now = self.clock.now_ms()
        if now - self._watch_read_at >= WATCH_EVERY_MS:
            await self._read_watched(now)
        adds = self.tally.take()
        if adds is None:
            return
        if self.tally.refused:
            self._watch(self.tally.refused, now)
        buckets = [
            SketchCounts(minute_bucket(now), MINUTE_BUCKET_TTL_MS, adds),
            SketchCounts(hour_bucket(now), HOUR_BUCKET_TTL_MS, adds),
        ]
        try:
            await _within(self.store.add_to_sketches(buckets, SKETCH_KEEP), self.timeout_s)
        except StoreError as exc:
            if now - self._warned_at >= MINUTE_MS and not isinstance(exc, CircuitOpenError):
                self._warned_at = now
                log.warning("who-is-blocked counts not stored: %s", exc)

    def _watch(self, refused: list[str], now: int) -> None:
        """Count the decisions of the users just refused, from now on, for an hour."""
        here = self._refused_here
        for user in refused:
            here.pop(user, None)  # re-inserted last: the dict stays oldest first
            here[user] = now
        for user, at in list(here.items()):
            if at > now - HOUR_MS and len(here) <= SKETCH_KEEP:
                break
            del here[user]
        self.tally.watched = self._refused_anywhere.union(here)

    async def _read_watched(self, now: int) -> None:
        """The users refused by any process this hour or the last, as the sketches keep
        them. A store that does not answer leaves the last read in place."""
        self._watch_read_at = now
        hours = [hour_bucket(now - HOUR_MS), hour_bucket(now)]
        try:
            sketches = await _within(self.store.read_sketches(hours, REFUSED), self.timeout_s)
        except StoreError:
            return  # the flush that follows says so, if the store is down
        names = (_name(member) for member in _summed(sketches))
        self._refused_anywhere = frozenset(name for name in names if name is not None)
        self.tally.watched = self._refused_anywhere.union(self._refused_here)

    def start(self) -> None:
        self._stopping = Stopping()
        self._task = asyncio.create_task(self._flush_forever(), name="ratewarden-activity")

    async def stop(self) -> None:
        """Let the flush under way finish (its store call has a deadline), then flush
        what is left."""
        if self._task is not None:
            self._stopping.set()
            try:
                await asyncio.wait_for(self._task, _STOP_WAIT_S)
            except TimeoutError:
                log.warning("activity flusher cancelled at shutdown")
            self._task = None
        await self.flush()

    async def _flush_forever(self) -> None:
        while not self._stopping.is_set():
            await self._stopping.nap(FLUSH_EVERY_S)
            try:
                await self.flush()
            except Exception:  # the flusher must outlive any surprise
                log.exception("activity flush: unexpected error; still flushing")


async def _within(operation: Awaitable[T], timeout_s: float) -> T:
    try:
        async with asyncio.timeout(timeout_s):
            return await operation
    except TimeoutError:
        raise StoreError(f"no answer in {timeout_s:g} s") from None


# -- the reads ------------------------------------------------------------------------------


class Window(StrEnum):
    MINUTES_15 = "15m"
    HOUR = "1h"
    DAY = "1d"


class Resolution(StrEnum):
    MINUTE = "minute"  # the last hour, by minute
    HOUR = "hour"  # the last day, by hour


@dataclass(frozen=True, slots=True)
class Span:
    """The buckets of a window, oldest first, and the start of each (ms)."""

    buckets: list[str]
    starts: list[int]


def span(step_ms: int, count: int, now_ms: int) -> Span:
    current = now_ms // step_ms
    numbers = range(current - count + 1, current + 1)
    prefix = "m" if step_ms == MINUTE_MS else "h"
    return Span([f"{prefix}{n}" for n in numbers], [n * step_ms for n in numbers])


def window_span(window: Window, now_ms: int) -> Span:
    if window is Window.DAY:
        return span(HOUR_MS, 24, now_ms)
    return span(MINUTE_MS, 15 if window is Window.MINUTES_15 else 60, now_ms)


def resolution_span(resolution: Resolution, now_ms: int) -> Span:
    if resolution is Resolution.HOUR:
        return span(HOUR_MS, 24, now_ms)
    return span(MINUTE_MS, 60, now_ms)


def _summed(sketches: Iterable[dict[str, int]]) -> dict[str, int]:
    sums: dict[str, int] = {}
    for sketch in sketches:
        for member, count in sketch.items():
            sums[member] = sums.get(member, 0) + count
    return sums


def _name(member: str) -> str | None:
    """A member's name (None: the others, or a member this version cannot read)."""
    try:
        found = json.loads(member)
    except ValueError:
        return None
    return found if isinstance(found, str) else None


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


class BlockedUser(BaseModel):
    user: str
    refusals: int
    decisions: int = Field(description="every decision of the user's in the window")
    top_rule: str | None = Field(description="the rule that refused the user most")
    top_rule_refusals: int
    top_tool: str | None = Field(description="the tool the user was refused most")
    top_tool_refusals: int


class BlockedResponse(BaseModel):
    window: Window
    since: str = Field(description="the first bucket's start, ISO 8601 UTC")
    generated_at: str
    users: list[BlockedUser] = Field(description="most refusals first")
    others: int = Field(
        description="refusals counted past a process's cap of distinct users in one flush"
    )
    approximate: bool = Field(
        description="a bucket's sketch was full: users below its top were not kept"
    )
    sketch_keep: int = Field(description="members each sketch of each bucket keeps")


def _top_by_user(why: dict[str, int]) -> dict[str, tuple[dict[str, int], dict[str, int]]]:
    """Each user's refusals by rule and by tool."""
    found: dict[str, tuple[dict[str, int], dict[str, int]]] = {}
    for member, count in why.items():
        try:
            user, rule, tool = json.loads(member)
        except (ValueError, TypeError):
            continue  # the others, or a member of another version
        rules, tools = found.setdefault(user, ({}, {}))
        rules[rule] = rules.get(rule, 0) + count
        tools[tool] = tools.get(tool, 0) + count
    return found


def _most(counts: dict[str, int]) -> tuple[str | None, int]:
    if not counts:
        return None, 0
    name = min(counts, key=lambda n: (-counts[n], n))
    return name, counts[name]


async def blocked(store: Store, window: Window, limit: int, now_ms: int) -> BlockedResponse:
    """The users refused most over `window`, with their top rule and tool."""
    where = window_span(window, now_ms)
    refused_by_bucket = await store.read_sketches(where.buckets, REFUSED)
    refused = _summed(refused_by_bucket)
    ranked = sorted(
        ((name, n) for m, n in refused.items() if (name := _name(m)) is not None and n > 0),
        key=lambda item: (-item[1], item[0]),
    )[:limit]
    decided = _summed(await store.read_sketches(where.buckets, DECIDED))
    whys = _top_by_user(_summed(await store.read_sketches(where.buckets, WHY)))
    users = []
    for user, refusals in ranked:
        rules, tools = whys.get(user, ({}, {}))
        rule, rule_n = _most(rules)
        tool, tool_n = _most(tools)
        users.append(
            BlockedUser(
                user=user,
                refusals=refusals,
                decisions=max(decided.get(_member(user), 0), refusals),
                top_rule=rule or None,
                top_rule_refusals=rule_n,
                top_tool=tool,
                top_tool_refusals=tool_n,
            )
        )
    return BlockedResponse(
        window=window,
        since=_iso(where.starts[0]),
        generated_at=_iso(now_ms),
        users=users,
        others=refused.get(OTHERS, 0),
        approximate=any(len(s) >= SKETCH_KEEP for s in refused_by_bucket),
        sketch_keep=SKETCH_KEEP,
    )


class Series(BaseModel):
    name: str = Field(description="the user or rule")
    decisions: list[int]
    refusals: list[int]


class ActivityResponse(BaseModel):
    resolution: Resolution
    times: list[int] = Field(description="each bucket's start, seconds since the epoch")
    series: list[Series] = Field(
        description="the user's or the rule's; with neither, the rules refusing most"
    )
    approximate: bool | None = Field(
        description="with neither user nor rule: a bucket's sketch was full, so rules "
        "below its top were not kept; null for one user or rule (exact unless a bucket "
        "held more than `sketch_keep` of them, as /v1/admin/blocked says)"
    )


TOP_RULES = 5  # rules charted when no user or rule is named


async def activity(
    store: Store, resolution: Resolution, user: str | None, rule: str | None, now_ms: int
) -> ActivityResponse:
    where = resolution_span(resolution, now_ms)
    times = [start // 1000 for start in where.starts]
    if user is not None or rule is not None:
        sketches = (DECIDED, REFUSED) if user is not None else (RULE_DECIDED, RULE_REFUSED)
        name = user if user is not None else rule
        assert name is not None
        decisions = await store.sketch_scores(where.buckets, sketches[0], _member(name))
        refusals = await store.sketch_scores(where.buckets, sketches[1], _member(name))
        return ActivityResponse(
            resolution=resolution,
            times=times,
            series=[Series(name=name, decisions=decisions, refusals=refusals)],
            approximate=None,
        )
    refused = await store.read_sketches(where.buckets, RULE_REFUSED)
    decided = await store.read_sketches(where.buckets, RULE_DECIDED)
    totals = _summed(refused)
    top = sorted(
        ((n, m) for m, n in totals.items() if _name(m) is not None and n > 0),
        key=lambda item: (-item[0], item[1]),
    )[:TOP_RULES]
    series = [
        Series(
            name=_name(member) or "",
            decisions=[sketch.get(member, 0) for sketch in decided],
            refusals=[sketch.get(member, 0) for sketch in refused],
        )
        for _, member in top
    ]
    full = any(len(s) >= SKETCH_KEEP for s in refused)
    return ActivityResponse(resolution=resolution, times=times, series=series, approximate=full)


# -- the routes -----------------------------------------------------------------------------

router = APIRouter()
ERRORS: dict[int | str, dict[str, object]] = {
    422: {"model": ErrorResponse, "description": "a parameter out of range, named"},
    503: {"model": ErrorResponse, "description": "the store did not answer"},
}
Limit = Annotated[int, Query(ge=1, le=100, description="users listed, at most 100")]
OptionalUser = Annotated[str | None, Query(min_length=1, max_length=256)]
OptionalRule = Annotated[str | None, Query(min_length=1, max_length=64)]


def _recorder(request: Request) -> ActivityRecorder:
    recorder: ActivityRecorder = request.app.state.activity
    return recorder


@router.get(
    "/v1/admin/blocked",
    response_model=BlockedResponse,
    responses=ERRORS,
    tags=["admin"],
)
async def get_blocked(
    request: Request, window: Window = Window.MINUTES_15, limit: Limit = 20
) -> BlockedResponse | JSONResponse:
    """Who is blocked: the users of the whole fleet refused most over the last 15 minutes,
    hour or day, each with the rule that refused them most and the tool they were refused
    most. From bounded per-minute and per-hour sketches (`approximate` says when one was
    full); read by the console's overview."""
    found = _recorder(request)
    try:
        read = blocked(found.store, window, limit, found.clock.now_ms())
        return await _within(read, found.timeout_s)
    except StoreError as exc:
        return error_response(503, "store_unavailable", f"the store did not answer: {exc}")


@router.get(
    "/v1/admin/activity",
    response_model=ActivityResponse,
    responses=ERRORS,
    tags=["admin"],
)
async def get_activity(
    request: Request,
    user: OptionalUser = None,
    rule: OptionalRule = None,
    resolution: Resolution = Resolution.MINUTE,
) -> ActivityResponse | JSONResponse:
    """Decisions and refusals over time, for the whole fleet: of one `user`, of one
    `rule`, or (with neither) of the rules refusing most; per minute over the last hour or
    per hour over the last day (`resolution`)."""
    if user is not None and rule is not None:
        problem = "give a user or a rule, not both"
        fields = [FieldError(field=name, message=problem) for name in ("user", "rule")]
        return error_response(422, "invalid_request", f"user, rule: {problem}", fields)
    found = _recorder(request)
    try:
        read = activity(found.store, resolution, user, rule, found.clock.now_ms())
        return await _within(read, found.timeout_s)
    except StoreError as exc:
        return error_response(503, "store_unavailable", f"the store did not answer: {exc}")
