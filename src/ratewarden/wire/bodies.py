"""The v1 HTTP API's request and response bodies.

Shared by the service and the client, and free of server imports, so a host agent can
load the client without FastAPI or Redis. `args` are matched by the policy's `args` rules
and hashed into counter keys, but never stored or logged (unless the operator turns the
audit's on).
"""

from __future__ import annotations

import sys
import unicodedata
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    AliasChoices,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    StrictBool,
    model_validator,
)
from pydantic_core import PydanticCustomError, PydanticSerializationError, to_json

from ratewarden.arguments import MAX_CUT, MAX_CUT_PATH, WHOLE_ARGS, ArgPath
from ratewarden.vocabulary import (
    MAX_CALL_ID,
    MAX_NAME,
    MAX_TAG,
    MAX_TAGS,
    MAX_TOKENS,
    MCP_HINTS,
    UNREADABLE_MESSAGE,
    CallKind,
    DecisionName,
    SettledOutcome,
    holds_until_settled,
    readable,
)
from ratewarden.vocabulary import SETTLE_PATH as VOCABULARY_SETTLE_PATH
from ratewarden.wire.bounded import ARGS_MARKS, depth, outside_strings

Subject = Annotated[str, Field(min_length=1, max_length=MAX_NAME)]


def no_control_characters(value: str) -> str:
    if any(unicodedata.category(char) == "Cc" for char in value):
        # A newline could never reach the settle route: the call could not be settled.
        raise ValueError("must not contain control characters: it travels in the settle URL")
    return value


def readable_name(value: str) -> str:
    if not readable(value):
        raise ValueError(UNREADABLE_MESSAGE)
    return value


CallId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_CALL_ID,
        json_schema_extra={"pattern": r"^[^\x00-\x1f\x7f-\x9f]+$"},
    ),
    AfterValidator(no_control_characters),
]
Tag = Annotated[str, Field(min_length=1, max_length=MAX_TAG)]
MAX_BATCH = 100
# `args` reach the policy's conditions and digests, and the audit log only when enabled:
# bounded so that no call can make a match, a digest, an audit entry, the recent-denials
# list or its serialisation blow up. They are checked on
# their compact JSON text in a fixed number of passes, each in C or Rust, however wide or
# deep they are: refusing a body must not cost the daemon more than serving one
# (docs/benchmarks.md, "Worst bodies").
MAX_ARGS_BYTES = 64 * 1024  # as compact UTF-8 JSON
MAX_ARGS_DEPTH = 32  # {"a": 1} is 1 level, {"a": {"b": [1]}} is 3
_INT_DIGITS = sys.get_int_max_str_digits()  # the longest integer Python reads (0: any)
_NOT_FINITE = "numbers must be finite: no NaN, Infinity" + (
    f" or integer of more than {_INT_DIGITS} digits" if _INT_DIGITS else ""
)


def _bounded_args(value: Any) -> dict[str, Any]:
    # The object as it is: validated as `dict[str, Any]`, it was copied key by key into a
    # new dict (0.05 us a key); JSON's keys are strings already, and a client's are held
    # to be by str.join, which takes nothing else (in C, a fifth of the copy).
    if not isinstance(value, dict):
        raise PydanticCustomError("dict_type", "Input should be a valid dictionary")
    try:
        "".join(value)
    except TypeError:
        raise ValueError("keys must be strings") from None
    text = _compact_json(value)
    if len(text) > MAX_ARGS_BYTES:
        raise ValueError(f"larger than {MAX_ARGS_BYTES} bytes as JSON (got {len(text)})")
    marks = ARGS_MARKS.marks(text)
    if b"b" not in marks and marks.count(b"f") <= MAX_ARGS_DEPTH:
        return value  # no N or I, too few brackets to nest deeper, strings included
    structure = outside_strings(marks)
    # Outside strings, an N or I can only begin NaN or (-)Infinity, which would reach the
    # audit log as non-JSON.
    if b"b" in structure:
        raise ValueError(_NOT_FINITE)
    if depth(structure) > MAX_ARGS_DEPTH:
        raise ValueError(f"nested deeper than {MAX_ARGS_DEPTH} levels")
    return value


def _compact_json(value: dict[str, Any]) -> bytes:
    """`value` as compact UTF-8 JSON, the way pydantic writes it (a client's own Python
    objects as their `str`)."""
    try:
        return to_json(value, fallback=str)
    except PydanticSerializationError as exc:
        if "depth" in str(exc):  # pydantic-core stops a few hundred levels down
            raise ValueError(f"nested deeper than {MAX_ARGS_DEPTH} levels") from None
        raise ValueError(f"cannot be written as JSON: {exc}") from None


Args = Annotated[
    dict[str, Any],
    PlainValidator(_bounded_args, json_schema_input_type=dict[str, Any]),
    Field(
        description="the tool's arguments, sent when the policy reads them (`send_args`); "
        f"never stored or logged unless the operator asks: at most {MAX_ARGS_DEPTH} "
        f"levels deep and {MAX_ARGS_BYTES} bytes as JSON, every number finite"
    ),
]


def _cut_path(text: str) -> str:
    if text != WHOLE_ARGS:
        ArgPath.parse(text)  # its ValueError names what is wrong with the path
    return text


ArgsCut = Annotated[
    list[Annotated[str, Field(min_length=1, max_length=MAX_CUT_PATH), AfterValidator(_cut_path)]],
    Field(
        max_length=MAX_CUT,
        description="paths into `args` whose values were cut to fit the caps (`*`: the "
        "arguments as a whole): a condition on them is read as holding in a rule's "
        "`match` and as failing in its `unless` (docs/policy.md, 'Arguments too large "
        "to send'). Clients fill it in (`arguments.bounded_args`); absent: nothing cut",
    ),
]

# Every unknown field costs pydantic an error of its own (0.4 us each): an object of a few
# thousand cost more to refuse than all else in its body. No object of a request has more
# than 12 names (CheckRequest's; ToolMetadata's 11 with their MCP aliases), so one with
# more than this is refused by its size alone, before its fields are read.
MAX_FIELDS = 64


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _few_fields(cls, data: Any) -> Any:
        if isinstance(data, dict) and len(data) > MAX_FIELDS:
            raise ValueError(f"at most {MAX_FIELDS} fields (got {len(data)})")
        return data


_MCP_NAMES = {ours: mcp for mcp, ours in MCP_HINTS.items()}


def _hint(name: str) -> Any:
    """A metadata flag, also accepted under its MCP annotation name (`readOnlyHint`)."""
    return Field(None, validation_alias=AliasChoices(name, _MCP_NAMES[name]))


class ToolMetadata(_Body):
    """What the caller knows about the tool; MCP annotation names are accepted too."""

    # `vocabulary.METADATA_FIELDS`, typed (tests/unit/test_vocabulary.py holds them equal), and
    # MCP's `title`. (A comment: the docstring is the API schema's description.)
    read_only: StrictBool | None = _hint("read_only")
    destructive: StrictBool | None = _hint("destructive")
    idempotent: StrictBool | None = _hint("idempotent")
    open_world: StrictBool | None = _hint("open_world")
    requires_confirmation: StrictBool | None = None
    tags: Annotated[list[Tag], Field(max_length=MAX_TAGS)] = []
    title: Annotated[str, Field(max_length=256)] | None = None  # MCP; ignored


# Who calls. Required with a service token (or no auth); with a user token it may be left
# out (the token's user), and naming anyone else is a 403 (service/vouch.py).
_USER = "who calls; optional with a user token, which acts as its own user only"


_HOST = (
    "the host whose own name `tool` is (a hook's host: claude-code, codex, gemini, cursor, "
    "agent-code, hermes); the daemon maps a tool its table knows to the canonical name"
)
_HOST_TOOL = "the host's own name for the tool, when `tool` is already the canonical one"


Tokens = Annotated[int, Field(ge=0, le=MAX_TOKENS, strict=True)]
# A model's name reaches the model's own sentence (`No price is known for model ...`).
ModelName = Annotated[str, Field(min_length=1, max_length=MAX_NAME), AfterValidator(readable_name)]
_KIND = "`tool` (the default) or `model`: a model call, priced from its tokens (docs/budgets.md)"
_MODEL = "a model call's model (kind: model); it becomes the call's `tool`"
_INPUT_TOKENS = "a model call's input tokens, counted or estimated: priced into its reservation"
_MAX_OUTPUT = (
    "a model call's most output tokens (default: the policy's `defaults.max_output_tokens`)"
)
# What a model call cannot carry: the daemon prices it, and it has no host tool or arguments.
_TOOL_ONLY = ("host", "host_tool", "cost", "metadata", "args", "args_cut")
_MODEL_ONLY = ("model", "input_tokens", "max_output_tokens")
_KIND_KEYS = frozenset({"kind", *_MODEL_ONLY})


def _model_call(data: dict[str, Any]) -> dict[str, Any]:
    """A model call's body as the engine reads it: its model as its `tool`; a field of
    the other kind of call is refused, by name."""
    if data.get("kind") != CallKind.MODEL:
        found = [name for name in _MODEL_ONLY if data.get(name) is not None]
        if found:
            raise ValueError(f"{', '.join(found)}: only for a model call (kind: model)")
        return data
    found = [name for name in _TOOL_ONLY if data.get(name) is not None]
    if found:
        raise ValueError(f"{', '.join(found)}: not for a model call (kind: model)")
    model, tool = data.get("model"), data.get("tool")
    if model is None:
        raise ValueError("model: a model call (kind: model) names its model")
    if tool is not None and tool != model:
        raise ValueError("tool: a model call's tool is its model; leave it out")
    return {**data, "tool": model}


class CheckRequest(_Body):
    user: Subject | None = Field(None, description=_USER)
    tool: Subject
    kind: CallKind = Field(CallKind.TOOL, description=_KIND)
    model: ModelName | None = Field(None, description=_MODEL)
    input_tokens: Tokens | None = Field(None, description=_INPUT_TOKENS)
    max_output_tokens: Tokens | None = Field(None, description=_MAX_OUTPUT)
    host: Subject | None = Field(None, description=_HOST)
    host_tool: Subject | None = Field(None, description=_HOST_TOOL)
    session: Subject | None = None
    team: Subject | None = None
    call_id: CallId | None = None
    cost: Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False, strict=True)] | None = None
    metadata: ToolMetadata | None = None
    args: Args | None = None
    args_cut: ArgsCut | None = None  # None, not []: a default list is copied per call
    approved: StrictBool = False

    @model_validator(mode="before")
    @classmethod
    def _kind_fields(cls, data: Any) -> Any:
        if isinstance(data, dict) and not _KIND_KEYS.isdisjoint(data):
            return _model_call(data)
        return data


class BatchRequest(_Body):
    # fail_fast: past the first invalid call the rest are not validated, so a body of
    # thousands of them costs one refusal, not thousands (the first call's errors are named).
    calls: Annotated[list[CheckRequest], Field(min_length=1, max_length=MAX_BATCH, fail_fast=True)]


Number = int | float  # calls and slots are counted in integers, money in decimals


class Violation(BaseModel):
    rule: str
    kind: str  # a vocabulary.RuleKind, or UNAVAILABLE (the store down, a fail mode refused)
    limit: Number
    window: str | None = None
    remaining: Number
    retry_after: float | None = None
    message: str
    spent: float | None = None  # budgets
    reserved: float | None = None
    currency: str | None = None
    period: str | None = None
    # The refusal's detail (docs/api.md): the counter's scope (each `per` dimension with
    # the call's value; an `args` one as a digest), what was used (calls in the window,
    # slots in use, money spent), and what an access or `args` rule's `match` asks.
    scope: dict[str, str | None] | None = None
    used: Number | None = None
    condition: str | None = None


class LimitState(BaseModel):
    rule: str
    kind: str
    limit: Number
    window: str | None = None
    # A token rate (`rate: N tokens/minute`): the call's settle adds its tokens, so the
    # call holds it, as it holds a budget's money, until it is settled.
    tokens: bool = False
    remaining: Number
    reset_after: float
    spent: float | None = None  # budgets
    reserved: float | None = None
    currency: str | None = None
    period: str | None = None


class CheckResponse(BaseModel):
    decision: DecisionName
    allowed: bool
    message: str
    call_id: str
    retry_after: float | None = None
    degraded: bool = False
    approved: bool = False
    violations: list[Violation] = []
    shadow: list[Violation] = []
    warnings: list[str] = []
    limits: list[LimitState] = []
    replayed: bool = False  # a repeated check with this call_id: the original answer
    # The policy in force reads calls' `args` (SPEC 2.1): send them with every check.
    send_args: bool = False
    # A loop rule keyed on results counts this call (docs/policy.md, "Loops"): settle it
    # with the `result_digest` of what the tool returned.
    send_result: bool = False

    @property
    def holds(self) -> bool:
        """Whether this allowed call holds something until it is settled: a concurrency
        slot, budget money, a token rate waiting for the model call's usage, or a loop
        count waiting for the tool's result (`send_result`).
        A degraded answer may: the daemon counts fail-open rules in its own process while
        the store is down, and frees the slot at the settle. A client's own fail-open
        answer (no daemon) lists no limits, so it holds nothing."""
        return self.allowed and holds_until_settled(self.send_result, self.limits)


class BatchResponse(BaseModel):
    results: list[CheckResponse]


class UsageItem(BaseModel):
    rule: str
    kind: str
    algorithm: str
    mode: str
    limit: Number | None  # None: unlimited for this user
    window: str | None = None
    used: Number  # calls in the window, slots in use, or money spent
    remaining: Number | None
    reset_after: float
    scope: dict[str, str | None]
    reserved: float | None = None  # budgets: held by calls not yet settled
    currency: str | None = None
    period: str | None = None


class UnshownRule(BaseModel):
    """A rule that may count the user's calls, left out of `limits` since its counter
    needs parts the request did not give (ask again with them)."""

    rule: str
    needs: list[str]  # of "tool", "session", "team"


class UsageResponse(BaseModel):
    user: str
    tool: str | None = None
    session: str | None = None
    team: str | None = None
    limits: list[UsageItem]
    unshown: list[UnshownRule] = []


# The settle route (vocabulary.SETTLE_PATH, where the command hook reads it too).
SETTLE_PATH = VOCABULARY_SETTLE_PATH


# A tool result's digest (arguments.result_digest), never the result: what a loop rule
# keyed on results compares (docs/policy.md, "Loops").
ResultDigest = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
_RESULT_DIGEST = (
    "32 lowercase hex digits: the digest of the tool's result (ratewarden.arguments."
    "result_digest), for loop rules keyed on results; never the result itself"
)


class ModelUsage(_Body):
    """What a model call used, as its provider reported it (genai-prices' names): priced
    by the daemon into the call's actual cost, and its tokens into token rates."""

    input_tokens: Tokens = 0  # every input token, cached ones included
    output_tokens: Tokens = 0
    cache_read_tokens: Tokens = 0  # of input_tokens: read from the provider's cache
    cache_write_tokens: Tokens = 0  # of input_tokens: written to it

    @model_validator(mode="after")
    def _cached_within_input(self) -> ModelUsage:
        if self.cache_read_tokens + self.cache_write_tokens > self.input_tokens:
            raise ValueError("cache_read_tokens and cache_write_tokens are part of input_tokens")
        return self

    @property
    def tokens(self) -> int:
        """What a token rate counts: every token in and out."""
        return self.input_tokens + self.output_tokens


class SettleRequest(_Body):
    cost: Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False, strict=True)] | None = None
    # How the call ended: free text (a host may pass its own); ours: vocabulary.CallStatus.
    status: Annotated[str, Field(min_length=1, max_length=32)] | None = None
    duration_ms: Annotated[float, Field(ge=0, allow_inf_nan=False, strict=True)] | None = None
    result_digest: ResultDigest | None = Field(None, description=_RESULT_DIGEST)
    # A model call's usage: the daemon prices it (an explicit `cost` is refused with it).
    usage: ModelUsage | None = None

    @model_validator(mode="after")
    def _one_price(self) -> SettleRequest:
        if self.usage is not None and self.cost is not None:
            raise ValueError("cost: a settle with usage is priced by the daemon; send one")
        return self


class SettleResponse(BaseModel):
    call_id: str
    outcome: SettledOutcome
    charged: dict[str, float] = {}  # budget rule -> amount charged by this settle
    tokens: int | None = None  # a model call's usage in tokens, as token rates count it


# A hook event's names and ids are mapped daemon-side (wire/names.py), so any text
# is taken, up to a bound that keeps a hostile one cheap.
MAX_HOOK_TEXT = 4096
HookText = Annotated[str, Field(min_length=1, max_length=MAX_HOOK_TEXT)]


class HookEvent(_Body):
    """A host's hook event as `ratewarden hook HOST` read it (`/v1/hooks/{host}/decision`).

    A call about to run names its `tool`; a finished one (`finished`) its `call_id`. Names
    and ids are taken as the host wrote them and made acceptable here; `args` (an object,
    or JSON text) go with the check when the policy reads them, and are left out when
    the wire would refuse them.
    """

    user: HookText | None = Field(None, description=_USER)
    # The hook's guess when nobody configured a user (the host's user, else its login
    # name): used only when the token does not say who calls and `user` is not given.
    default_user: HookText | None = Field(
        None, description="who calls if neither the token nor `user` says (a user token ignores it)"
    )
    team: HookText | None = None
    tool: HookText | None = None
    session: HookText | None = None
    call_id: HookText | None = None
    args: Any = Field(None, description="the tool's input; never stored or logged")
    args_cut: ArgsCut | None = None
    finished: bool = False
    status: Annotated[str, Field(min_length=1, max_length=32)] | None = None
    duration_ms: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    cost: Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)] | None = None
    result_digest: ResultDigest | None = Field(None, description=_RESULT_DIGEST)


class HookDecision(BaseModel):
    """The answer to a hook: the decision, ratewarden's message, and notes for the log;
    for a refusal, its detail as a check answer carries it (`retry_after`, `violations`)
    and in one line for a host that shows its user more than the model reads (`detail`)."""

    decision: DecisionName
    message: str = ""
    notes: list[str] = []
    retry_after: float | None = None
    violations: list[Violation] = []
    detail: str = ""


# -- what an admin names -------------------------------------------------------------------

MAX_OVERRIDE_NAMES = 100  # users or groups in one override


def plain_text(value: str) -> str:
    """A text an operator reads in a list, a page or a log: no control characters, no
    invisible formatting (a right-to-left override would make it read otherwise), no line
    separators (vocabulary.readable)."""
    if not readable(value):
        raise ValueError(UNREADABLE_MESSAGE)
    return value


Reason = Annotated[str, Field(min_length=1, max_length=500), AfterValidator(plain_text)]
# A name an admin sets (an override's users and groups): plain text too,
# since `override list`, the console and the audit log show it. Only what an admin sends
# is checked: a stored override is read as it is, and shown escaped (vocabulary.shown).
AdminName = Annotated[str, Field(min_length=1, max_length=MAX_NAME), AfterValidator(plain_text)]
RuleRef = Annotated[str, Field(min_length=1, max_length=64), AfterValidator(plain_text)]
AdminNames = Annotated[list[AdminName], Field(min_length=1, max_length=MAX_OVERRIDE_NAMES)]


class ResetRequest(_Body):
    # The user as the check API took it (any name a caller gave, so an admin can reset
    # what it counted); the rule as the file names it, plain text.
    user: Subject | None = None
    rule: RuleRef | None = None


class ForgottenCounter(BaseModel):
    """A user's counter as it stood just before a reset deleted it."""

    rule: str
    kind: str  # rate, budget or concurrency
    used: Number  # calls in the window, slots in use, or money spent
    reserved: float | None = None  # budgets: held by calls not yet settled, forgotten too
    currency: str | None = None


def held_by_user(item: Any) -> bool:
    """Whether a usage item (UsageItem, or the engine's Usage) read for a user alone is one
    a reset of that user forgets and lists: a counter scoped by the user that holds
    something. The daemon's `forgotten` and `ratewarden reset`'s question both use it."""
    counted = item.limit is not None and item.kind != "access"
    return counted and "user" in item.scope and bool(item.used or item.reserved)


class ResetResponse(BaseModel):
    deleted: int  # counter keys deleted
    # What the reset forgot, for a reset that names a user: that user's counters kept per
    # user alone (those kept per tool, session or team too are deleted, not listed). None
    # for a rule reset for every user: nothing is read before it (docs/overrides.md).
    forgotten: list[ForgottenCounter] | None = None


class DenialsResponse(BaseModel):
    """Audit entries: id, time, event (deny, ask, shadow_deny, approved), decision, user,
    tool (canonical), host_tool (the host's own name, or null), session, team, call_id,
    rule, rules, reason, message, retry_after, degraded, violations (each rule's detail,
    as a check's answer carries it: docs/api.md) (and args, when the operator enabled
    them)."""

    denials: list[dict[str, Any]]


class Capabilities(BaseModel):
    """What a client needs to know before its first check (GET /v1/capabilities)."""

    policy_version: str
    send_args: bool  # the policy reads calls' `args`: send them with every check


class PolicyResponse(BaseModel):
    version: str
    source: str
    policy: dict[str, Any]


class FieldError(BaseModel):
    field: str
    message: str


class ErrorResponse(BaseModel):
    error: str
    message: str
    fields: list[FieldError] = []


# -- runtime overrides (POST/GET /v1/admin/overrides, DELETE /v1/admin/overrides/{id}) --


class OverrideLimit(BaseModel):
    """Who and what an override changes: the file's `overrides` vocabulary."""

    users: Annotated[list[Subject], Field(min_length=1, max_length=MAX_OVERRIDE_NAMES)] | None = (
        None
    )
    groups: Annotated[list[Subject], Field(min_length=1, max_length=MAX_OVERRIDE_NAMES)] | None = (
        None
    )
    rule: Annotated[str, Field(min_length=1, max_length=64)]
    rate: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    budget: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    concurrency: Annotated[int, Field(ge=0, le=1_000_000, strict=True)] | None = None
    burst: Annotated[int, Field(ge=1, le=1_000_000, strict=True)] | None = None
    unlimited: Annotated[bool, Field(strict=True)] = False


class OverrideRequest(_Body, OverrideLimit):
    """One runtime override: the file's `overrides` vocabulary, an expiry, and why."""

    users: AdminNames | None = None
    groups: AdminNames | None = None
    rule: RuleRef
    ttl: Annotated[str, Field(min_length=1, max_length=32)] | None = None  # "10m", "2h"
    until: AwareDatetime | None = None
    reason: Reason


class Override(OverrideLimit):
    """A runtime override as stored and listed."""

    id: str
    expires_at: AwareDatetime | None = None
    reason: str
    set_by: str
    set_at: AwareDatetime
    # Listed only: False when the policy in force has no place for it (why: `idle`).
    active: bool = True
    idle: str | None = None


class OverridesResponse(BaseModel):
    overrides: list[Override]
    version: int  # raised by every change, on every daemon sharing the store


class OverrideRemoved(BaseModel):
    id: str
    removed: bool


# -- GET /v1/admin/spend (service/spend.py) ------------------------------------------


class SpendRow(BaseModel):
    day: str = Field(description="the UTC day, YYYY-MM-DD")
    rule: str
    scope: dict[str, str] = Field(description="the budget's dimensions: user, team, ...")
    amount: float = Field(description="money charged that day; negative: a late refund")
    currency: str | None = Field(description="the rule's currency; null: none or rule gone")
    model: float = Field(
        0.0, description="the part of amount that model calls' settles charged (the rest: "
        "tool calls, and reservations charged at their estimate when they expired)"
    )  # fmt: skip


class SpendTotal(BaseModel):
    currency: str | None
    amount: float


class SpendResponse(BaseModel):
    since: str = Field(description="the first day counted, YYYY-MM-DD (UTC)")
    until: str = Field(description="the last day counted, YYYY-MM-DD (UTC), inclusive")
    rows: list[SpendRow] = Field(description="per day, rule and scope, oldest day first")
    totals: list[SpendTotal] = Field(description="the rows' sum, per currency")
    truncated: bool = Field(
        description="more records than this answer holds (10 000 rows, 100 000 records "
        "read): narrow by user, team, rule or dates"
    )
    retention_days: int = Field(description="how many days past its day a record is kept")
