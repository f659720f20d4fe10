"""Every Redis key ratewarden writes, and why each lives as long as it does.

Key shape: `rw:{<rule>|<dimension>=<value>|...}:<algorithm>`, for example
`rw:{terminal-per-minute|user=discord%3A1234}:sw`.

- Rule names and dimension values are percent-encoded with nothing left unescaped but
  letters, digits and `-._~`, so no user or tool string (braces, colons, `|`, `=`,
  newlines, NULs, any Unicode) can produce another counter's key: the encoding is
  injective and the separators never appear inside a part.
- Everything that identifies one counter sits inside the `{...}` hash tag, so a
  counter's keys always land on one cluster node.
- The algorithm is part of the key so that a reload that changes a rule's algorithm
  starts a fresh counter instead of misreading the old one's bytes.
- Dimensions absent from a call (no session given) encode as empty; requests never
  carry empty strings, so "absent" cannot collide with a real value.
- `args` and `args.PATH` dimensions (`|args=`, `|args[PATH]=`) hold a 32-hex-digit
  digest of the canonical JSON of the arguments (or of the one argument), never their
  text: a key says which call repeats, not what it said.

A loop rule keyed on results (`same_result: true`) keeps its counter's last result beside
it: `rw:{<rule>|<dimension>=<value>|...}:<algorithm>:r`, a string holding the 32-hex-digit
digest a settle brought (never the result), in the counter's hash tag (one cluster slot,
and reached by the counter's reset patterns).

Call records: `rw:call:{<call_id>}`, a hash kept for allowed calls that hold something
(a reservation, a slot), that a loop rule keyed on results counted, or whose caller
chose the call_id. Their own prefix keeps them out of reach of counter patterns
(`rw:{...`), whatever the rules are named.

Spend records: `rw:spend:{<rule>|<dimension>=<value>|...}:<day>`, a string of the
micro-units one budget counter charged on one UTC day (days since the epoch, by the
store's clock; negative when a late settle refunded more than was charged that day),
written by the counters script with the charge itself (budget.lua `record_spend`). The
counter's hash tag (one cluster slot with its counter); the `spend:` prefix keeps them
out of reach of counter patterns (`rw:{...`): a reset clears a user's counters, not the
history of what was spent. Beside it, `rw:spend:{...}:<day>:m`: the part of that day's
charge that model calls' settles moved (settle.lua, the same script step), kept as long.

The budget sweep's claim: `rw:admin:sweep`, a string naming the process that sweeps
(service/sweep.py), set only if absent (NX) and then kept by its holder, whose every tick
renews it for two sweep intervals: one process walks the budget counters, tick after tick
(its walk goes on where it stopped), and when it dies another takes over within two
intervals. Outside the counter prefix (`rw:{...`): no reset reaches it.

Recent denials: `rw:denials`, a list capped at its length (1000 audit entries), no TTL:
it is the operator's window on what was blocked, and never grows.

Who is blocked (service/activity.py; none of these is read or written by a decision):
- `rw:activity:{<bucket>}:<sketch>`: one sorted set per time bucket and sketch, its
  members JSON strings (a user, a rule, or `[user, rule, tool]`; `null` stands for "every
  other" past the in-process cap), its scores counts. A bucket is a minute
  (`m<minutes since the epoch>`, kept `MINUTE_BUCKET_TTL_MS`) or an hour (`h<hours since
  the epoch>`, kept `HOUR_BUCKET_TTL_MS`); each sketch is trimmed to its `SKETCH_KEEP`
  highest members at every flush. One hash tag per bucket: a bucket's commands go to
  one cluster node.
- `rw:denials:{users}` (a sorted set of percent-encoded users by their last refusal, ms)
  and `rw:denials:{users}:<encoded user>` (a list of that user's newest audit entries,
  like `rw:denials`): each list capped at `USER_DENIALS_KEEP` entries and kept
  `USER_DENIALS_TTL_MS` from its last refusal; the index capped at `USER_DENIALS_USERS`
  users, the lists of the users trimmed out deleted with them. One hash tag: the
  lists and their index are on one node, and the trim is one script there.
Both prefixes are out of reach of counter patterns (`rw:{...`): `ratewarden reset` and
`POST /v1/admin/reset` forget counters, not the record of who was refused.
Notifications (service/notify.py), under `rw:notify:`, out of reach of counter patterns
(`rw:{...`) and of a reset, each part percent-encoded as a counter's:
- a claim, `rw:notify:{<event>|<rule>|<dimension>=<value>...|<start ms>}`: taken with
  `SET NX PX` by the one daemon that sends the notification of that event, rule, scope
  and period (a budget's period, a refusal window); it lives until the period ends (plus
  a minute, for clocks that disagree), so no daemon sends it again within the period,
  and then goes: the next period notifies afresh.
- a refusal count, `rw:notify:{refused|<rule>|user=<user>|<window start ms>}`: a fixed
  window of one user's refusals by one rule, counted by every daemon's worker (INCRBY);
  it lives until its window ends (plus a minute), after which nothing counts into it.

TTLs (each key expires once it can no longer change a decision):
- sliding window (`sw`): the window length, refreshed at every admission: once the
  newest admission has left the window, the counter holds nothing that counts.
- token bucket (`tb`): until the theoretical arrival time, when the bucket is full again.
- fixed window (`fw`): until the end of the current clock-aligned window.
- budget (`bg`): until the end of the budget period or the last reservation's expiry
  plus 15 minutes (budget.SWEEP_GRACE_MS), whichever is later: spend must count for the
  whole period, and an unsettled reservation must still be there to be charged, by the
  next check of its scope or else by the budget sweep (service/sweep.py), which runs at
  most every 300 s: the 15 minutes give it three ticks at least to find the counter due
  before it expires with its estimate uncharged.
- concurrency (`cc`): the lease timeout, from the latest lease: every slot has been
  reclaimed by then.
- a loop rule's kept result (`:r`): the rule's window, from the settle that kept it: a
  result older than that no longer restarts a count (every call it could have joined has
  left a sliding window by then).
- spend record: until the end of its day plus RATEWARDEN_SPEND_RETENTION_DAYS (default
  90; set from the day, not from the last write): so the history is bounded in time, and
  in size by the budget counters charged per day times the days kept.
- call record: the policy's `call_ttl` (default 1 h, at least the lease timeout and the
  reservation TTL), so a late settle still finds what its call holds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import quote, unquote

from ratewarden.calls import Call
from ratewarden.limiter.ops import Kind
from ratewarden.vocabulary import ARGS_DIMENSION

PREFIX = "rw"
DENIALS_KEY = f"{PREFIX}:denials"
# Runtime overrides (POST /v1/admin/overrides): a hash of id -> JSON document, and a
# version counter the daemons poll. One hash tag puts both on one cluster node; the
# `admin:` prefix keeps them out of reach of counter patterns (`rw:{...`). No TTL: an
# override's expiry is in its document, and an expired one is removed by the next change.
OVERRIDES_KEY = f"{PREFIX}:admin:{{overrides}}"
OVERRIDES_VERSION_KEY = f"{PREFIX}:admin:{{overrides}}:version"
# The fleet (service/fleet.py): every process's poll reads the overrides version and the
# change counters, and writes its report, in one script; so these keys carry the
# overrides' hash tag, to sit on their cluster node. The change counters (a hash of
# change -> count, `reset`, `reload`) have no TTL: a count only matters by moving, and
# a hash of two fields never grows. Each report (a hash of process -> JSON) lives as long
# as its score in the alive set (its expiry, Redis ms): `REPORT_TTL_MS` after its last
# poll, so a dead process drops out and its report is removed by the next poll.
FLEET_CHANGES_KEY = f"{PREFIX}:admin:{{overrides}}:changes"
FLEET_REPORTS_KEY = f"{PREFIX}:admin:{{overrides}}:reports"
FLEET_ALIVE_KEY = f"{PREFIX}:admin:{{overrides}}:alive"
# Who is blocked (the docstring above): the sketches' buckets and the per-user refusals.
MINUTE_BUCKET_TTL_MS = 2 * 3_600_000  # the hour the console reads, and a margin
HOUR_BUCKET_TTL_MS = 26 * 3_600_000  # the day the console reads, and a margin
SKETCH_KEEP = 1_000  # members each sketch of each bucket keeps: its top
USER_DENIALS_INDEX_KEY = f"{PREFIX}:denials:{{users}}"
USER_DENIALS_KEEP = 50  # entries kept per user
USER_DENIALS_USERS = 500  # users whose lists are kept: the most recently refused
USER_DENIALS_TTL_MS = 24 * 3_600_000


def activity_key(bucket: str, sketch: str) -> str:
    """One sketch of one time bucket (`m<minute>` or `h<hour>`)."""
    return f"{PREFIX}:activity:{{{bucket}}}:{sketch}"


def user_denials_key(user: str) -> str:
    """A user's own recent refusals, beside their index (one hash tag)."""
    return f"{USER_DENIALS_INDEX_KEY}:{encode.__wrapped__(user)}"


NOTICE_PREFIX = f"{PREFIX}:notify:"
NOTICE_SLACK_MS = 60_000  # a notification key outlives its period by this (clock skew)


@lru_cache(maxsize=65_536)
def encode(part: str) -> str:
    """Percent-encode one key part; cached because the same users and tools recur."""
    return quote(part, safe="")


def counter_key(rule: str, kind: Kind, scope: Iterable[tuple[str, str | None]]) -> str:
    """The key of one rule's counter for one scope (the `per` dimensions and their values)."""
    values = dict(scope)
    get = values.get  # the dimensions are Call's fields; absent ones encode as empty
    probe = Call(get("user") or "", get("tool") or "", "", get("session"), get("team"))
    return CounterKeys.of(rule, kind, values).for_call(probe)


@dataclass(frozen=True, slots=True)
class CounterKeys:
    """One rule's counter keys, with the parts every key of the rule shares joined once.

    `rw:{<rule>` + `|<dimension>=<value>` per dimension + `}:<algorithm>`: only the values
    differ from call to call (the engine makes one per rule and policy).
    """

    head: str  # rw:{<rule>
    dims: tuple[tuple[str, str], ...]  # (dimension, "|<dimension>=") in the rule's order
    tail: str  # }:<algorithm>
    hashed: bool = False  # counts per `args` or `args.PATH`: values are digests

    @classmethod
    def of(cls, rule: str, kind: Kind, per: Iterable[str]) -> CounterKeys:
        # An `args.PATH` dimension is written `args[PATH]`, its path encoded: no path can
        # end the part in `user=` and be taken for the user by a reset's pattern.
        dims = tuple((dim, f"|{_dimension_name(dim)}=") for dim in per)
        hashed = any(dim.startswith("args") for dim in per)
        return cls(f"{PREFIX}:{{{encode(rule)}", dims, f"}}:{kind.value}", hashed)

    def for_call(self, call: Call) -> str:
        """The key for the call's values of the `per` dimensions (absent: empty)."""
        if self.hashed:
            return self._hashed_key(call)
        key = self.head  # appended to in place: a third of the cost of a join here
        for dim, separator in self.dims:
            key += separator + encode(getattr(call, dim) or "")
        return key + self.tail

    def _hashed_key(self, call: Call) -> str:
        """As for_call, with `args` dimensions as digests (hex: nothing to encode, and
        kept out of `encode`'s cache, where every distinct call would push out a user)."""
        key = self.head
        for dim, separator in self.dims:
            value = call.dimension(dim) or ""
            key += separator + (value if dim.startswith("args") else encode(value))
        return key + self.tail


def _dimension_name(dim: str) -> str:
    if dim.startswith(ARGS_DIMENSION):
        return f"args[{encode(dim.removeprefix(ARGS_DIMENSION))}]"
    return dim


# Every budget counter, for the sweep's SCAN (the algorithm is the key's last part).
BUDGET_PATTERN = f"{PREFIX}:{{*}}:{Kind.BUDGET.value}"
SWEEP_CLAIM_KEY = f"{PREFIX}:admin:sweep"


def counter_rule(key: str) -> str | None:
    """The rule named in a counter's key (`rw:{<rule>|...}:<alg>`); None if not one."""
    if not key.startswith(f"{PREFIX}:{{") or "}:" not in key:
        return None
    inner = key[len(PREFIX) + 2 : key.rindex("}:")]
    return unquote(inner.split("|", 1)[0])


def all_keys_pattern() -> str:
    """A SCAN pattern matching every counter ratewarden owns (not the call records)."""
    return f"{PREFIX}:{{*"


SPEND_PREFIX = f"{PREFIX}:spend:"


def spend_patterns(rule: str | None, user: str | None, team: str | None) -> list[str]:
    """SCAN patterns for the spend records of `rule` (any), narrowed by `user` (or else
    `team`); a caller still compares every record it reads (`parse_spend_key`) with all
    three. Encoded parts hold no glob character (`*?[]\\` are percent-encoded)."""
    rule_part = "*" if rule is None else encode(rule)
    for name, value in (("user", user), ("team", team)):
        if value is not None:
            return [f"{SPEND_PREFIX}{{{rule_part}|*{name}={encode(value)}[|}}]*"]
    if rule is None:
        return [f"{SPEND_PREFIX}{{*"]
    return [f"{SPEND_PREFIX}{{{rule_part}|*", f"{SPEND_PREFIX}{{{rule_part}}}:*"]


@dataclass(frozen=True, slots=True)
class SpendKey:
    """A spend record's key, read back: whose budget, and which day."""

    rule: str
    scope: tuple[tuple[str, str], ...]  # (dimension, value) in the rule's order
    day: int  # days since 1970-01-01, UTC
    model: bool = False  # the day's model record (`...:<day>:m`): model calls' part


def parse_spend_key(key: str) -> SpendKey | None:
    """The parts of a key `spend_key` made; None for anything else."""
    if not key.startswith(SPEND_PREFIX + "{") or "}:" not in key:
        return None
    inner, _, day = key[len(SPEND_PREFIX) + 1 :].rpartition("}:")
    day, model = (day[:-2], True) if day.endswith(":m") else (day, False)
    if not day.isascii() or not day.isdigit():
        return None
    rule, *parts = inner.split("|")
    scope = []
    for part in parts:
        name, equals, value = part.partition("=")
        if not equals:
            return None
        if name.startswith("args["):  # args[PATH]: its path is encoded, its value a digest
            name = ARGS_DIMENSION + unquote(name[5:-1])
        scope.append((name, unquote(value)))
    return SpendKey(unquote(rule), tuple(scope), int(day), model)


def record_key(call_id: str) -> str:
    """The record of an allowed call, by the caller's idempotency key."""
    # Encoded past `encode`'s cache: call ids rarely recur, and each would push out a user.
    return f"{PREFIX}:call:{{{encode.__wrapped__(call_id)}}}"


def reset_patterns(user: str | None, rule: str | None) -> list[str]:
    """SCAN patterns for the counters of `user` (any rule) and/or `rule` (any scope).

    Encoded parts contain no glob characters, and `user=` can only appear as a dimension
    marker (`=` inside values is encoded), so a pattern never reaches another user.
    """
    rule_part = "*" if rule is None else encode(rule)
    if user is None:
        return [f"{PREFIX}:{{{rule_part}|*", f"{PREFIX}:{{{rule_part}}}:*"]
    return [f"{PREFIX}:{{{rule_part}|*user={encode(user)}[|}}]*"]


def notice_key(
    event: str, rule: str, scope: Iterable[tuple[str, str | None]], start_ms: int
) -> str:
    """The claim of the notification of `event` for `rule` and one scope, in the period
    (or window) that began at `start_ms`: whoever takes it sends the notification."""
    parts = "".join(f"|{_dimension_name(dim)}={encode(value or '')}" for dim, value in scope)
    return f"{NOTICE_PREFIX}{{{encode(event)}|{encode(rule)}{parts}|{start_ms}}}"


def refusal_count_key(rule: str, user: str, start_ms: int) -> str:
    """The fleet's count of `user`'s refusals by `rule` in the window begun at `start_ms`."""
    return f"{NOTICE_PREFIX}{{refused|{encode(rule)}|user={encode(user)}|{start_ms}}}"
