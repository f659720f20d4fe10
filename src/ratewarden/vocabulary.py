"""The words the daemon, the client and every adapter share, each spelled once, here.

- the enums of a policy (rule kinds, algorithms, modes, what to do past a limit, fail
  modes, the `per` dimensions): `policy/schema.py` types its fields with them and
  `policy/model.py` compiles to them;
- the names of decisions, of settle outcomes and of how a call ended (`CallStatus`);
- the metadata fields a caller may state about a tool, and their MCP names;
- every sentence a model can read: the daemon's default messages (rendered by
  `policy/messages.py`) and the adapters' and hooks' own fallbacks;
- the one call-id scheme of every host, `call_id`, and the daemon's own for a check that
  named none, `daemon_call_id`;
- the one reader of the client side's `RATEWARDEN_*` variables: `ClientSettings` (the
  daemon's own settings are `service/settings.py`).

Standard library only: the client, the hooks and the adapters load this inside a host
agent's process, without FastAPI, Redis, pydantic-settings or the policy loader
(tests/unit/test_vocabulary.py checks it in a fresh interpreter). A command hook loads it
once per tool call, so it keeps to the cheap part of the library (no logging, dataclasses,
uuid, hashlib, getpass or unicodedata at import: tests/unit/test_hook_imports.py).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any, Literal, NamedTuple, get_args

# -- the policy's words ------------------------------------------------------------------


class RuleKind(StrEnum):
    """What a rule limits. A counting rule states exactly one of rate, concurrency or
    budget, under the same name; an access rule (no counter) states `deny:` or `ask:`.

    Not the counter kinds of the script (`limiter.ops.Kind`: sw, tb, fw, bg, cc), which
    say which arithmetic runs a counter: a rate rule's counter is sw, tb or fw.
    """

    RATE = "rate"
    CONCURRENCY = "concurrency"
    BUDGET = "budget"
    ACCESS = "access"


class CallKind(StrEnum):
    """What a check asks about: a tool call, or a model call (docs/budgets.md), whose
    `tool` is the model's name and whose cost the daemon prices from its tokens."""

    TOOL = "tool"
    MODEL = "model"


class MatchKind(StrEnum):
    """A rule's `match: {kind: ...}`: the kinds of call it covers (`any`: both)."""

    TOOL = "tool"
    MODEL = "model"
    ANY = "any"


MAX_TOKENS = 100_000_000  # tokens in one field of a model call: 50x the largest context
# The settle route, the call id one path segment in it: the client quotes an id into
# `{call_id}`, the daemon's route and its auth table put their path converters there.
SETTLE_PATH = "/v1/calls/{call_id}/settle"

# The kinds with a counter in the store, each stated by the field of its own name.
COUNTED_KINDS = (RuleKind.RATE, RuleKind.CONCURRENCY, RuleKind.BUDGET)
# An access rule's two fields: what it answers a call it matches, with its text.
ACCESS_ANSWERS = ("deny", "ask")
# What an allowed call holds until it is settled (or its lease or reservation expires).
HOLDING_KINDS = frozenset({RuleKind.CONCURRENCY, RuleKind.BUDGET})


def holds_until_settled(send_result: bool, limits: Iterable[Any]) -> bool:
    """Whether an allowed call holds something until its settle: a concurrency slot or
    budget money, a token rate waiting for its usage (each limit's `kind` and `tokens`),
    or a loop count waiting for the tool's result (`send_result`). The wire's
    CheckResponse.holds and the Envoy services' settle-at-once both ask this."""
    return send_result or any(limit.kind in HOLDING_KINDS or limit.tokens for limit in limits)


# A verdict's kind when no rule could be asked: the store was down and a fail mode refused.
UNAVAILABLE = "unavailable"
# The default budget refusal while calls in flight hold part of the budget.
BUDGET_HELD = "budget_held"
# The default refusal of a rate rule counted per identical call (`per: [..., args]`).
REPEATED = "repeated"
# ...and of one keyed on results (`same_result: true`): the same call got the same result.
SAME_RESULT = "same_result"
# Model calls' own refusals (docs/budgets.md): a budget that refuses a model call (with
# calls in flight holding part of it); one whose room left is less than the call could
# cost; a token rate; a model nothing prices.
MODEL_BUDGET = "model_budget"
MODEL_BUDGET_HELD = "model_budget_held"
MODEL_CALL_TOO_COSTLY = "model_call_too_costly"
TOKEN_RATE = "token_rate"
NO_PRICE = "no_price"


class Algorithm(StrEnum):
    SLIDING_WINDOW = "sliding_window"
    TOKEN_BUCKET = "token_bucket"
    FIXED_WINDOW = "fixed_window"


class Mode(StrEnum):
    ENFORCE = "enforce"
    SHADOW = "shadow"


class OnExceed(StrEnum):
    DENY = "deny"
    ASK = "ask"


class FailMode(StrEnum):
    """The answer when the daemon (or its store) cannot be asked."""

    OPEN = "open"
    CLOSED = "closed"


class Dimension(StrEnum):
    """What a rule may count per (`per:`): the call's parts of the same names."""

    USER = "user"
    TOOL = "tool"
    SESSION = "session"
    TEAM = "team"
    ARGS = "args"  # a fingerprint of the whole canonical `args`; `args.PATH`: one argument


ARGS_DIMENSION = "args."  # `per: [args.url]`: a counter per value of one argument


class NotifyEvent(StrEnum):
    """What a webhook is told of (docs/observability.md, "Notifications")."""

    SOFT_LIMIT = "budget.soft_limit"  # an allowed call left a budget past its soft limit
    EXHAUSTED = "budget.exhausted"  # a budget rule refused a call for lack of money
    REPEATED_REFUSALS = "refusals.repeated"  # a user refused by one rule > N times in a window


_FAIL_MODES = frozenset(FailMode)


def hint_flags(source: Mapping[str, Any]) -> dict[str, bool]:
    """The metadata flags among a tool's hints, under our names or MCP's (`readOnlyHint`):
    booleans only, anything else ignored. What the MCP relay, the ContextForge plugin and
    the Strands adapter read from a tool's annotations."""
    found: dict[str, bool] = {}
    for key, value in source.items():
        name = MCP_HINTS.get(key, key)
        if name in METADATA_FLAGS and isinstance(value, bool):
            found[name] = value
    return found


def fail_mode(value: object) -> FailMode:
    """`value` as a fail mode; ValueError naming the choices otherwise."""
    if not isinstance(value, str) or value not in _FAIL_MODES:
        choices = " or ".join(repr(mode.value) for mode in FailMode)
        raise ValueError(f"fail must be {choices}, got {value!r}")
    return FailMode(value)


# -- decisions and settles (strings on the hot path, so Literal types, not enums) --------

DecisionName = Literal["allow", "deny", "ask"]
SettledOutcome = Literal["settled", "already_settled"]  # what a settle answers
SettleOutcome = Literal[SettledOutcome, "unknown"]  # "unknown": a 404, no such call
DECISIONS: tuple[DecisionName, ...] = get_args(DecisionName)
SETTLE_OUTCOMES: tuple[SettleOutcome, ...] = get_args(SettleOutcome)


class CallStatus(StrEnum):
    """How an admitted call ended, as the host reports it in its settle (`status`).

    The settle's `status` is free text on the wire (a host such as hermes passes its own);
    these are the ones ratewarden's adapters, hooks and MCP guard send. Not the store's
    answer to a settle (`limiter.script.SettleStatus`: settled, already settled, unknown).
    """

    OK = "ok"
    ERROR = "error"  # the tool raised, or answered with an error
    CANCELLED = "cancelled"  # stopped while it ran (MCP's notifications/cancelled, Strands)
    ABANDONED = "abandoned"  # its session ended first (the MCP guard)
    BLOCKED = "blocked"  # allowed by ratewarden, then stopped by a later hook: it never ran


# -- what a caller may say about a tool ---------------------------------------------------

# The boolean facts, in the order the API, the policy's `match:` and the engine list them.
# Each model that holds them (calls.ToolFacts, wire.ToolMetadata, schema.MatchSpec) states
# them as typed fields; tests/unit/test_vocabulary.py holds all of them equal to this.
METADATA_FLAGS = ("read_only", "destructive", "idempotent", "open_world", "requires_confirmation")
METADATA_FIELDS = (*METADATA_FLAGS, "tags")
# MCP ToolAnnotations names -> ours (requires_confirmation has no MCP name).
MCP_HINTS = {
    "readOnlyHint": "read_only",
    "destructiveHint": "destructive",
    "idempotentHint": "idempotent",
    "openWorldHint": "open_world",
}
MAX_TAG = 64  # characters in one tag
MAX_TAGS = 32  # tags on one call

# -- every sentence a model can read ------------------------------------------------------

# The daemon's default messages, by rule kind; `{fields}` as in a rule's `message:`.
TEMPLATES: dict[str, str] = {
    RuleKind.RATE: "Rate limit: max {limit} {label} calls per {window}",
    RuleKind.CONCURRENCY: "Concurrency limit: max {limit} {label} calls at once",
    RuleKind.BUDGET: (
        "Budget exceeded for {label} tools: spent {spent} of {budget} {currency} this {period}"
    ),
    # The same refusal while calls in flight hold part of the budget: what is held counts
    # as much as what is spent, and the model must not read "spent 0.00" as room left.
    BUDGET_HELD: (
        "Budget exceeded for {label} tools: {spent} spent and {reserved} held by calls in "
        "flight of {budget} {currency} this {period}"
    ),
    # A fail-closed refusal, from the daemon (store down) or the client (daemon down).
    UNAVAILABLE: "Tool guard unavailable; {label} calls are paused",
    # Waiting is not the advice here (no retry suffix): the model should change course.
    REPEATED: (
        "Repeated call: {label} was called with the same arguments {limit} times in the "
        "last {window}; change the arguments or the approach"
    ),
    SAME_RESULT: (
        "Repeated call: {label} returned the same result {limit} times in a row; change the "
        "arguments or the approach"
    ),
    MODEL_BUDGET: (
        "Budget exceeded for model calls: {spent} spent of {budget} {currency} this {period}"
    ),
    MODEL_BUDGET_HELD: (
        "Budget exceeded for model calls: {spent} spent and {reserved} held by calls in "
        "flight of {budget} {currency} this {period}"
    ),
    # Waiting is not the advice: a smaller call fits now.
    MODEL_CALL_TOO_COSTLY: (
        "This model call could cost up to {cost} {currency}; {remaining} {currency} is left "
        "of {whose} {budget} {currency} budget: ask for a shorter answer or a smaller model"
    ),
    TOKEN_RATE: "Rate limit: max {limit} model tokens per {window}",
    NO_PRICE: (
        "No price is known for model {tool}: ask the operator to add it to the policy's models"
    ),
}
NO_RETRY_SUFFIX = frozenset({REPEATED, SAME_RESULT, MODEL_CALL_TOO_COSTLY, NO_PRICE})
# `{whose}` in MODEL_CALL_TOO_COSTLY, by budget period.
PERIOD_OWNER = {
    "hour": "this hour's",
    "day": "today's",
    "week": "this week's",
    "month": "this month's",
}
# Fields a `message:` template may use, by the kind of rule it belongs to.
_COMMON = frozenset({"limit", "label", "retry_after", "remaining", "user", "tool", "rule"})
TEMPLATE_FIELDS: dict[str, frozenset[str]] = {
    RuleKind.RATE: _COMMON | {"window"},
    RuleKind.CONCURRENCY: _COMMON,
    RuleKind.BUDGET: _COMMON | {"spent", "reserved", "budget", "currency", "period"},
    # An access rule's text: no counter, so no limit, remaining or wait to tell.
    RuleKind.ACCESS: frozenset({"label", "user", "tool", "rule"}),
}
RETRY_SUFFIX = " (retry in {wait})"  # after a default message, when waiting helps
RETRY_LATER = "later"  # `{retry_after}` when no wait will help (a limit of 0)
SOFT_LIMIT_WARNING = (
    "Budget soft limit: {label} tools at {share:.0f}% of {limit:.2f} {currency} this "
    "{period} ({rule})"
)
APPROVED_PAST = "approved past {rule}: {message}"  # a warning on an approved call
# A refusal's detail on one line, for a host that shows its user more than the model
# reads (a hook's `systemMessage`): which rule, counting what, how much was used, what
# its `match` asks, and when to retry. Each part is left out when the rule has none.
REFUSAL_DETAIL = "ratewarden: rule {rule} ({kind}) refused the call{scope}{used}{condition}{retry}"
DETAIL_SCOPE = " for {scope}"  # "user=alice, tool=terminal"
DETAIL_USED = ": {used} of {limit} used"
DETAIL_CONDITION = "; it applies when {condition}"
DETAIL_RETRY = "; retry in {wait}"
# The adapters' and hooks' own: a refusal that came without a message...
REFUSED = "ratewarden refused this {tool} call"
REFUSED_BY = "{decision} by ratewarden"  # agent-code: "deny by ratewarden"
BLOCKED = "Blocked by ratewarden"  # hermes' shell hook
# ...an `ask` where the host has a human to ask (hermes' gate), or has none (Strands)...
ASK_REASON = "ratewarden asks a human to approve this {tool} call"
APPROVAL_NEEDED = (
    "A human must approve this call before it can run: tell the user why, "
    "and do not retry it until they have approved it."
)
# ...and a hook that cannot read its host's input, failing closed.
UNREADABLE = (
    "Tool guard unavailable: cannot read the {host} hook input ({reason}); tool calls are paused"
)
# A hook input too large to check, whatever the fail mode: its size is the caller's doing,
# and a guard that let it through would be passed by padding any call.
TOO_LARGE = "Tool call refused: its input is too large to check ({reason})"
# ...and an HTTP hook whose URL names a user its token may not act as (a host runs the
# call on an error status, so the refusal is the host's own deny).
NOT_VOUCHED = (
    "Tool call refused by the tool guard: the hook names a user ({field}) its token may not "
    "act as; fix the hook's configuration"
)

SENTENCES: dict[str, str] = {
    **{f"template {kind}": text for kind, text in TEMPLATES.items()},
    "retry suffix": RETRY_SUFFIX,
    "refusal detail": REFUSAL_DETAIL,
    "soft limit warning": SOFT_LIMIT_WARNING,
    "approved past": APPROVED_PAST,
    "refused": REFUSED,
    "refused by": REFUSED_BY,
    "blocked": BLOCKED,
    "ask reason": ASK_REASON,
    "approval needed": APPROVAL_NEEDED,
    "unreadable": UNREADABLE,
    "too large": TOO_LARGE,
    "not vouched": NOT_VOUCHED,
}


def unavailable(label: str) -> str:
    """The fail-closed refusal for `label` (a tool's catalogue label, or its name)."""
    return TEMPLATES[UNAVAILABLE].format(label=label)


def needs_approval(message: str) -> str:
    """An `ask` for a host that cannot ask anyone: the reason, then what the model must do."""
    return f"{message.rstrip('. ')}. {APPROVAL_NEEDED}"


# -- call ids ---------------------------------------------------------------------------

MAX_NAME = 256  # the API's limit on user, tool, session and team
MAX_CALL_ID = 128  # the API's limit on call_id
SUFFIX_CHARS = 16  # hex digits after the `~`: 64 bits, random or of SHA-256
SEPARATOR = "~"  # unreserved in a URL: a call id travels in the settle path unescaped
# Every id an adapter or hook makes, and every name or id it had to replace.
CALL_ID_PATTERN = rf"[^\x00-\x1f\x7f-\x9f]{{0,{MAX_CALL_ID - SUFFIX_CHARS - 1}}}~[0-9a-f]{{16}}"
_UNSENDABLE = frozenset({"Cc", "Cs"})  # control characters, lone surrogates


def call_id(host: str, host_call_id: object = None, *, unique: str | None = None) -> str:
    """The call id of one check: `<lead>~<16 hex digits>`, at most 128 characters.

    The lead is the host's own id for the call (its tool-call id) as far as the API takes
    it, else the host's name (`hermes`, `pydantic-ai`). The digits are random, so that
    each check is a call of its own: the daemon replays an allowed call_id without
    counting it, and models that reuse their tool-call ids (`call_0` on every turn) would
    otherwise go uncounted. A host whose pre and post hooks run in separate processes
    passes `unique` (what tells this call from another with the same tool-call id): the
    digits are then the digest of both ids, so both hooks name the same call, and two
    calls apart even when their leads had to be cut.
    """
    given = host_call_id if isinstance(host_call_id, str) else ""
    lead = _sendable(given, MAX_CALL_ID) or host
    if unique is None:
        return tagged(lead, os.urandom(SUFFIX_CHARS // 2).hex(), MAX_CALL_ID)
    return tagged(lead, digest(f"{given}\x00{unique}"), MAX_CALL_ID)


DAEMON_CALL_ID_PREFIX = "rw-"


def daemon_call_id() -> str:
    """The second scheme, the daemon's own: the id of a check that named none, `rw-` and
    128 random bits in 32 hex digits. Unguessable, so only the caller who got it can
    settle the call (a host's `call_id` carries 64 bits after a lead others may know)."""
    return DAEMON_CALL_ID_PREFIX + os.urandom(16).hex()


def tagged(lead: str, suffix: str, limit: int) -> str:
    """`<lead>~<suffix>` in at most `limit` characters, the lead cut to fit and stripped
    of what the API refuses (control characters, lone surrogates)."""
    return f"{_sendable(lead, limit - len(suffix) - len(SEPARATOR))}{SEPARATOR}{suffix}"


def digest(value: str) -> str:
    """The first 16 hex digits of `value`'s SHA-256 (lone surrogates included, one to one)."""
    raw = value.encode("utf-8", "surrogatepass")
    import hashlib  # seldom needed by a hook, which imports only what it uses

    return hashlib.sha256(raw).hexdigest()[:SUFFIX_CHARS]


def sendable(value: str) -> bool:
    """Whether `value` holds no control character or lone surrogate."""
    # Printable text holds neither (nor other categories the API takes: a fast yes).
    return value.isprintable() or _sendable(value, len(value)) == value


def _sendable(value: str, limit: int) -> str:
    """The first `limit` characters of `value` that the API takes (reading no further: a
    host may send megabytes)."""
    if value.isprintable():  # holds neither (the common case, read at C speed)
        return value[: max(limit, 0)]
    import unicodedata  # not at import: a hook process seldom needs it

    kept = (char for char in value if unicodedata.category(char) not in _UNSENDABLE)
    return "".join(itertools.islice(kept, max(limit, 0)))


# -- names an operator reads ---------------------------------------------------------------

# What no name or text an admin sets may hold, and what a terminal must not be handed raw:
# control characters (an ESC starts an ANSI sequence, a NUL or newline cuts a line),
# invisible formatting (a right-to-left override makes a name read otherwise), lone
# surrogates, and the line and paragraph separators (a line break to many readers).
_UNREADABLE = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
UNREADABLE_MESSAGE = (
    "must be plain text: no control characters, invisible formatting (such as a "
    "right-to-left override) or line separators"
)


def readable(value: str) -> bool:
    """Whether `value` holds nothing of `_UNREADABLE` (what an admin may name)."""
    if value.isprintable():  # holds none of them (the common case, read at C speed)
        return True
    import unicodedata  # not at import: a hook process seldom needs it

    return not any(unicodedata.category(char) in _UNREADABLE for char in value)


def shown(value: object) -> str:
    """`value` as text safe to print to a terminal: each unreadable character (and any
    other that is not printable, such as a no-break space) as its Python escape, `\\x1b`,
    `\\u202e`. A name stored by an older version, or by anything else with the store's
    password, reaches the operator's terminal only this way."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else ascii(char)[1:-1] for char in text)


# -- the client side's settings ------------------------------------------------------------

# Where the daemon listens unless told otherwise (service/settings.py's `host` and `port`
# default to these), so where a client looks for it.
DEFAULT_HOST = "127.0.0.1"  # loopback: nothing is exposed until an operator says so
DEFAULT_PORT = 8470
DEFAULT_URL = f"http://{DEFAULT_HOST}:{DEFAULT_PORT}"
DEFAULT_TIMEOUT_S = 2.0  # a client's (the CLI's) wait for an answer
ADAPTER_TIMEOUT_S = 1.0  # a guard in front of every tool call must not stall the agent


class ClientSettings(NamedTuple):
    """The `RATEWARDEN_*` variables the client, the hooks, the adapters, the MCP proxy and
    gateway and the CLI's client commands read (the daemon's own: service/settings.py).

    Read when a guard or hook is made, never at import. An argument or flag given in code
    wins over each of them.
    """

    url: str = DEFAULT_URL  # RATEWARDEN_URL: where the daemon is
    token: str | None = None  # RATEWARDEN_TOKEN: the bearer token to send
    user: str | None = None  # RATEWARDEN_USER: who calls when the host does not say
    fail_text: str = ""  # RATEWARDEN_FAIL, as set: see `fail`

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None) -> ClientSettings:
        env = os.environ if environ is None else environ
        return cls(
            url=env.get("RATEWARDEN_URL") or DEFAULT_URL,
            token=env.get("RATEWARDEN_TOKEN") or None,
            user=env.get("RATEWARDEN_USER") or None,
            fail_text=env.get("RATEWARDEN_FAIL", "").strip().lower(),
        )

    @property
    def fail(self) -> FailMode:
        """`open` when unset; anything but `open` or `closed` is a typo, and fails closed."""
        if self.fail_text in ("", FailMode.OPEN):
            return FailMode.OPEN
        if self.fail_text != FailMode.CLOSED:
            import logging  # only for this warning: a hook process imports no logging

            logging.getLogger("ratewarden.client").error(
                "RATEWARDEN_FAIL=%r is neither 'open' nor 'closed'; failing closed", self.fail_text
            )
        return FailMode.CLOSED

    def user_or_login(self) -> str:
        """RATEWARDEN_USER, else the OS login name (OSError or KeyError without one)."""
        import getpass  # not at import: a hook process seldom needs it

        return self.user or getpass.getuser()
