"""The policy file's shape, as pydantic models (what the YAML may say).

These models only check each field on its own; `compile.py` checks how fields relate
(rule names, groups, overrides) and builds the runtime `Policy`.
"""

from __future__ import annotations

import re
import zoneinfo
from collections.abc import Mapping
from decimal import Decimal
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    StrictBool,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ratewarden.arguments import ArgPath
from ratewarden.policy.conditions import compile_condition
from ratewarden.policy.durations import (
    MAX_AMOUNT,
    Budget,
    Rate,
    parse_budget,
    parse_duration,
    parse_rate,
)
from ratewarden.policy.messages import compile_template
from ratewarden.vocabulary import (
    ACCESS_ANSWERS,
    ARGS_DIMENSION,
    COUNTED_KINDS,
    MAX_TOKENS,
    METADATA_FIELDS,
    METADATA_FLAGS,
    UNREADABLE_MESSAGE,
    Algorithm,
    CallKind,
    Dimension,
    FailMode,
    MatchKind,
    Mode,
    NotifyEvent,
    OnExceed,
    RuleKind,
    readable,
)
from ratewarden.wire.tools import HOST_TOOLS


def _plain(value: str) -> str:
    if not readable(value):  # it reaches metrics, logs, the console and the CLI
        raise ValueError(UNREADABLE_MESSAGE)
    return value


# A user, group, tool, tag or label: what an admin names, shown to operators.
Name = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(_plain)]


def _listify(value: object) -> object:
    return [value] if isinstance(value, str) else value


# `tool: terminal` or `tool: [terminal, shell]`; a list either way, so errors name the item.
Names = Annotated[list[Name], BeforeValidator(_listify)]
RuleName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
RateText = Annotated[Rate, PlainValidator(parse_rate), PlainSerializer(str)]
BudgetText = Annotated[Budget, PlainValidator(parse_budget), PlainSerializer(str)]
DurationText = Annotated[
    int, PlainValidator(parse_duration), PlainSerializer(lambda ms: f"{ms // 1000}s")
]


def _ten_decimals(value: float) -> float:
    if Decimal(str(value)).as_tuple().exponent < -10:  # type: ignore[operator]
        raise ValueError(f"a price has at most ten decimals, got {value!r}")
    return value


def _percent(value: object) -> float:
    """`80%` or 80 -> 0.8: the share of a budget at which calls get flagged."""
    text = value.strip().removesuffix("%") if isinstance(value, str) else value
    try:
        number = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f'expected a percentage such as "80%", got {value!r}') from None
    if not 0 < number <= 100:
        raise ValueError(f"a soft limit is a percentage between 0 and 100, got {value!r}")
    return number / 100


Percent = Annotated[float, PlainValidator(_percent), PlainSerializer(lambda f: f"{f * 100:g}%")]

# Exact sliding windows keep one timestamp per unit of limit (6 bytes each); above this
# use token_bucket or fixed_window, whose memory does not grow with the limit.
MAX_SLIDING_LIMIT = 100_000


def sliding_cap_problem(rate: Rate, algorithm: Algorithm | None) -> str | None:
    """What is wrong with `rate` on a sliding window (None: the default algorithm here,
    as for a rule that names none), or None: a rule's and its overrides' one cap."""
    if rate.tokens or rate.limit <= MAX_SLIDING_LIMIT:  # token rates: fixed windows
        return None
    if algorithm not in (None, Algorithm.SLIDING_WINDOW):
        return None
    return (
        f"sliding_window limits are capped at {MAX_SLIDING_LIMIT} calls per window; "
        "use token_bucket or fixed_window for larger limits"
    )


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# A model's price in USD per million tokens (the providers' unit), up to ten decimals.
PricePerMTok = Annotated[
    float, Field(ge=0, le=1_000_000, allow_inf_nan=False), AfterValidator(_ten_decimals)
]


class ModelPriceSpec(_Strict):
    """A model's price (`models:` lines, `defaults.model_price`), USD per million tokens;
    a cache price left out charges those tokens at the input price."""

    input: PricePerMTok
    output: PricePerMTok
    cache_read: PricePerMTok | None = None
    cache_write: PricePerMTok | None = None


class DefaultsSpec(_Strict):
    mode: Mode = Mode.ENFORCE
    fail: FailMode = FailMode.OPEN
    algorithm: Algorithm = Algorithm.SLIDING_WINDOW
    timezone: str = "UTC"
    # A concurrency slot whose call never settles is reclaimed after this long.
    lease_timeout: DurationText = 600_000
    # A budget reservation never settled is charged at its estimate after this long.
    reservation_ttl: DurationText = 3_600_000
    # Records of allowed calls (for idempotent re-checks and settles) are kept this long.
    call_ttl: DurationText = 3_600_000
    # A model call that names no `max_output_tokens` reserves this many (docs/budgets.md).
    max_output_tokens: Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)] = 4096
    # The price of a model nothing else prices; without it such a model call is refused.
    model_price: ModelPriceSpec | None = None

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str) -> str:
        try:
            zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown timezone {value!r}") from None
        return value

    @model_validator(mode="after")
    def _records_outlive_leases(self) -> DefaultsSpec:
        if self.call_ttl < max(self.lease_timeout, self.reservation_ttl):
            raise ValueError("call_ttl must be at least lease_timeout and reservation_ttl")
        return self


def _known_host(value: str) -> str:
    if value not in HOST_TOOLS:
        raise ValueError(f"unknown host {value!r}; known: {', '.join(HOST_TOOLS)}")
    return value


# A host as `ratewarden hook HOST` names it: whose calls a `same_as` line is about.
HostName = Annotated[str, Field(min_length=1, max_length=64), AfterValidator(_known_host)]


class ToolSpec(_Strict):
    """A catalogue entry: a tool's label and cost, or (`same_as`) the canonical tool a
    name stands for, on some hosts (`host`) or all, its arguments renamed (`args`:
    theirs -> ours). docs/policy.md, "Canonical tool names"."""

    label: Name | None = None
    cost: Annotated[float, Field(ge=0, le=MAX_AMOUNT, allow_inf_nan=False)] = 0.0
    same_as: Name | None = None
    host: Annotated[list[HostName], BeforeValidator(_listify), Field(min_length=1)] | None = None
    args: dict[Name, Name] | None = None
    # What the tool is, for a call whose caller does not say (its own metadata wins, flag
    # by flag): how a caller that cannot see MCP's annotations, such as Envoy, still meets
    # `match: {read_only: ...}` (docs/policy.md, "The tool catalogue classifies").
    read_only: StrictBool | None = None
    destructive: StrictBool | None = None
    idempotent: StrictBool | None = None
    open_world: StrictBool | None = None
    requires_confirmation: StrictBool | None = None

    @model_validator(mode="after")
    def _names_or_money(self) -> ToolSpec:
        if self.same_as is None:
            for name in ("host", "args"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name} only applies with same_as")
            return self
        for name in ("label", "cost", *METADATA_FLAGS):
            if name in self.model_fields_set:
                raise ValueError(
                    f"{name} does not apply with same_as: its calls are {self.same_as!r}'s; "
                    f"give the {name} to {self.same_as!r}'s own entry"
                )
        _check_renames(self.args or {})
        return self


def _check_renames(renames: dict[str, str]) -> None:
    """Refuse renames whose outcome would hang on their order (a chain, a swap, two
    arguments into one), or whose new key no rule's path could name: either way a rule
    written against the canonical shape would read another value than the tool runs on."""
    into: dict[str, str] = {}
    for theirs, ours in renames.items():
        if ours == theirs:
            raise ValueError(f"args.{theirs}: renamed to itself")
        if ours in renames:
            raise ValueError(
                f"args.{theirs}: {ours!r} is itself renamed (args.{ours}): renames are one "
                "step, none the target of another"
            )
        if ours in into:
            raise ValueError(f"args: {into[ours]!r} and {theirs!r} are both renamed to {ours!r}")
        into[ours] = theirs
        try:
            ArgPath.parse(ours)
        except ValueError as exc:
            raise ValueError(f"args.{theirs}: {ours!r} is not an argument name: {exc}") from None
        if "." in ours or ours == "*":
            raise ValueError(f"args.{theirs}: {ours!r} is a path, not one argument's name")


def _arg_path(text: str) -> str:
    ArgPath.parse(text)  # a ValueError naming the problem
    return text


def _condition(value: object) -> object:
    compile_condition(value)  # type: ignore[arg-type]  # checked there, by kind
    return value


# `match.args`: a path into the call's `args` -> a condition on the value found there.
ArgPathText = Annotated[str, AfterValidator(_arg_path)]
# A list is accepted by the type only to be refused by compile_condition with its hint
# (write `{in: [...]}`), instead of pydantic's five "not a valid ..." lines.
ConditionSpec = Annotated[
    str | bool | int | float | list[Any] | dict[str, Any], AfterValidator(_condition)
]


_DIMENSIONS = frozenset(Dimension)


def _per_dimension(value: object) -> str:
    """`user`, `tool`, `session`, `team`, `args`, or `args.PATH` (one argument's value)."""
    if isinstance(value, str) and value.startswith(ARGS_DIMENSION):
        ArgPath.parse(value.removeprefix(ARGS_DIMENSION))
        return value
    choices = ", ".join(repr(d.value) for d in Dimension)
    if not isinstance(value, str) or value not in _DIMENSIONS:
        raise ValueError(f"expected one of {choices} or 'args.PATH', got {value!r}")
    return str(value)


PerDimension = Annotated[str, PlainValidator(_per_dimension, json_schema_input_type=str)]


class MatchSpec(_Strict):
    # Which calls: tool calls (the default), model calls, or both (docs/budgets.md).
    kind: MatchKind | None = None
    model: Names | None = None  # model calls of these models (names or globs)
    tool: Names | None = None
    user: Names | None = None
    group: Names | None = None
    session: Names | None = None
    team: Names | None = None
    read_only: StrictBool | None = None
    destructive: StrictBool | None = None
    idempotent: StrictBool | None = None
    open_world: StrictBool | None = None
    requires_confirmation: StrictBool | None = None
    tags: list[Name] | None = None
    args: dict[ArgPathText, ConditionSpec] | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> MatchSpec:
        about_tools = [name for name in _TOOL_CONDITIONS if getattr(self, name) is not None]
        if self.model is not None and self.kind in (MatchKind.TOOL, MatchKind.ANY):
            raise ValueError(f"model: names model calls; kind: {self.kind} says otherwise")
        if about_tools and (
            self.kind in (MatchKind.MODEL, MatchKind.ANY) or self.model is not None
        ):
            said = f"kind: {self.kind}" if self.kind is not None else "model:"
            raise ValueError(
                f"{about_tools[0]}: asks about a tool call, and {said} covers model calls"
            )
        return self

    @property
    def kinds(self) -> frozenset[str] | None:
        """The kinds of call it states (None: it says nothing of the kind)."""
        if self.kind is MatchKind.ANY:
            return frozenset(CallKind)
        if self.kind is not None:
            return frozenset({self.kind})
        return frozenset({CallKind.MODEL}) if self.model is not None else None


# What a `match` asks of a tool call alone: a model call has none of them.
_TOOL_CONDITIONS = ("tool", *METADATA_FIELDS, "args")


# An access rule's text: a template, like `message:`.
AccessText = Annotated[str, Field(min_length=1, max_length=1024)]


class RuleSpec(_Strict):
    name: RuleName
    match: MatchSpec = MatchSpec()
    unless: MatchSpec | None = None  # a call it matches is not covered by the rule
    per: list[PerDimension] = Field(default_factory=lambda: [Dimension.USER.value])
    rate: RateText | None = None
    concurrency: Annotated[int, Field(ge=0)] | None = None
    budget: BudgetText | None = None
    deny: AccessText | None = None
    ask: AccessText | None = None
    algorithm: Algorithm | None = None
    burst: Annotated[int, Field(ge=1)] | None = None
    # A loop rule keyed on results: identical calls count while they get the same result.
    same_result: StrictBool | None = None
    currency: Annotated[str, Field(min_length=1, max_length=16)] | None = None
    soft_limit: Percent | None = None
    lease_timeout: DurationText | None = None
    mode: Mode | None = None
    on_exceed: OnExceed = OnExceed.DENY
    fail: FailMode | None = None
    label: Name | None = None
    message: str | None = None

    @field_validator("per")
    @classmethod
    def _unique_dimensions(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"lists a dimension twice: {value}")
        return value

    @field_validator("deny", "ask")
    @classmethod
    def _valid_text(cls, value: str | None) -> str | None:
        if value is not None:
            compile_template(value, RuleKind.ACCESS)
        return value

    @field_validator("message")
    @classmethod
    def _valid_template(cls, value: str | None, info: ValidationInfo) -> str | None:
        # The limit fields come first, so the rule's kind is known here.
        if value is not None:
            compile_template(value, kind_of(info.data))
        return value

    @property
    def kind(self) -> RuleKind:
        """What the rule limits (once validated, it states exactly one limit)."""
        return kind_of(vars(self))

    @model_validator(mode="after")
    def _one_limit(self) -> RuleSpec:
        given = [*limits_in(vars(self)), *(a for a in ACCESS_ANSWERS if getattr(self, a))]
        if len(given) != 1:
            raise ValueError(
                "a rule needs exactly one of rate, concurrency, budget, deny, ask"
                + (f" (got {', '.join(given)})" if given else "")
            )
        if self.kind is RuleKind.ACCESS:
            return self._an_access_rule()
        if self.burst is not None and self.algorithm != Algorithm.TOKEN_BUCKET:
            raise ValueError("burst only applies to algorithm: token_bucket")
        _only_with(self, RuleKind.RATE, "algorithm", "burst", "same_result")
        if self.same_result is not None and not any(d.startswith("args") for d in self.per):
            raise ValueError(
                "same_result needs per to name args or args.PATH: it keys a loop rule, "
                "which counts identical calls, on their results"
            )
        if self.rate is not None and self.rate.tokens:
            self._a_token_rate()
        _only_with(self, RuleKind.BUDGET, "currency", "soft_limit")
        _only_with(self, RuleKind.CONCURRENCY, "lease_timeout")
        if self.rate and (problem := sliding_cap_problem(self.rate, self.algorithm)):
            raise ValueError(problem)
        return self

    def _a_token_rate(self) -> None:
        """Token rates count model calls' tokens in fixed windows (docs/budgets.md)."""
        if self.algorithm not in (None, Algorithm.FIXED_WINDOW):
            raise ValueError("a token rate counts in fixed windows: algorithm: fixed_window")
        if self.same_result is not None:
            raise ValueError("same_result does not apply to a token rate")
        if self.match.kind is MatchKind.TOOL:
            raise ValueError("a token rate counts model calls' tokens: not kind: tool")

    def _an_access_rule(self) -> RuleSpec:
        """An access rule counts nothing: what only a counter uses has no place in it."""
        counting = (
            "algorithm", "burst", "same_result", "currency", "soft_limit", "lease_timeout",
            "message",
        )  # fmt: skip
        for name in (*counting, "fail"):
            if getattr(self, name) is not None:
                why = "its text is the message" if name == "message" else "it has no counter"
                raise ValueError(f"{name} does not apply to an access rule (deny/ask): {why}")
        if "per" in self.model_fields_set:
            raise ValueError("per does not apply to an access rule (deny/ask): no counter")
        if "on_exceed" in self.model_fields_set:
            raise ValueError("on_exceed does not apply to an access rule: write deny: or ask:")
        return self


def kind_of(fields: Mapping[str, object]) -> RuleKind:
    """The kind of rule whose limit fields (`rate`, `concurrency`, `budget`, the kinds'
    own names; `deny`, `ask`) are `fields`: access if it says deny or ask, else the first
    given of budget and concurrency, else rate."""
    if any(fields.get(answer) is not None for answer in ACCESS_ANSWERS):
        return RuleKind.ACCESS
    return next(
        (k for k in (RuleKind.BUDGET, RuleKind.CONCURRENCY) if fields.get(k) is not None),
        RuleKind.RATE,
    )


def limits_in(fields: Mapping[str, object]) -> list[RuleKind]:
    """The counted limits `fields` state, in the kinds' order (rate, concurrency, budget)."""
    return [kind for kind in COUNTED_KINDS if fields.get(kind) is not None]


def _only_with(rule: RuleSpec, kind: str, *fields: str) -> None:
    for name in fields:
        if getattr(rule, name) is not None and getattr(rule, kind) is None:
            raise ValueError(f"{name} only applies to {kind} rules")


class OverrideSpec(_Strict):
    users: list[Name] | None = None
    groups: list[Name] | None = None
    rule: RuleName
    rate: RateText | None = None
    concurrency: Annotated[int, Field(ge=0)] | None = None
    budget: BudgetText | None = None
    burst: Annotated[int, Field(ge=1)] | None = None
    unlimited: StrictBool = False

    @model_validator(mode="after")
    def _who_and_what(self) -> OverrideSpec:
        if not self.users and not self.groups:
            raise ValueError("an override needs users or groups")
        given = limits_in(vars(self))
        if self.unlimited and given:
            raise ValueError(f"unlimited: true cannot be combined with {', '.join(given)}")
        if not self.unlimited and len(given) != 1 and self.burst is None:
            raise ValueError("an override needs one of rate, concurrency, budget, unlimited")
        return self


MAX_URL_LENGTH = 2048
MAX_WEBHOOKS = 16
# A notification's refusal window: at least a second (as any duration), at most a week.
MAX_REFUSAL_WINDOW_MS = 7 * 24 * 3_600_000


def webhook_url(value: str) -> str:
    """An absolute http(s) URL with a host, nothing invisible in it: where a daemon posts."""
    if not value.isprintable() or any(char.isspace() for char in value):
        raise ValueError("a URL has no spaces or control characters")
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018  # a port that is not a number raises here
    except ValueError as exc:
        raise ValueError(f"not a URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"a webhook URL starts with https:// or http://, got {value[:40]!r}")
    if not parts.hostname:
        raise ValueError("a webhook URL names a host")
    if len(value) > MAX_URL_LENGTH:
        raise ValueError(f"a webhook URL is at most {MAX_URL_LENGTH} characters")
    return value


def _no_credentials(value: str) -> str:
    """A policy's URL holds no user or password: the file is no place for a secret (and
    `GET /v1/policy` shows it); `url_env` names a variable that holds such a URL."""
    if urlsplit(value).username is not None:
        raise ValueError("a webhook URL in the policy holds no credentials; use url_env")
    return value


WebhookUrl = Annotated[
    str,
    Field(min_length=1, max_length=MAX_URL_LENGTH),
    AfterValidator(webhook_url),
    AfterValidator(_no_credentials),
]
# The name of an environment variable (a secret is never written in the policy file).
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def _env_name(value: str) -> str:
    if not _ENV_NAME.fullmatch(value):
        raise ValueError(
            "the name of an environment variable (letters, digits and _, not first a digit, "
            f"at most 128), got {value[:40]!r}"
        )
    return value


EnvName = Annotated[str, AfterValidator(_env_name)]


def _unique_events(value: list[NotifyEvent]) -> list[NotifyEvent]:
    if len(set(value)) != len(value):
        raise ValueError(f"lists an event twice: {[str(e) for e in value]}")
    return value


class WebhookSpec(_Strict):
    """Where notifications are posted: `url`, or `url_env` naming the variable that holds
    it (a Slack webhook's URL is itself a secret); `secret_env` names the variable that
    holds the HMAC secret the body is signed with; `events`: which ones (default all)."""

    url: WebhookUrl | None = None
    url_env: EnvName | None = None
    secret_env: EnvName | None = None
    events: Annotated[list[NotifyEvent], Field(min_length=1), AfterValidator(_unique_events)] = (
        Field(default_factory=lambda: list(NotifyEvent))
    )

    @model_validator(mode="after")
    def _one_url(self) -> WebhookSpec:
        if (self.url is None) == (self.url_env is None):
            raise ValueError("a webhook needs exactly one of url, url_env")
        return self


def _refusal_window(value: object) -> int:
    window_ms = parse_duration(value)
    if window_ms > MAX_REFUSAL_WINDOW_MS:
        raise ValueError(f"a refusal window is at most 7d, got {value!r}")
    return window_ms


RefusalWindow = Annotated[
    int, PlainValidator(_refusal_window), PlainSerializer(lambda ms: f"{ms // 1000}s")
]


class RepeatedRefusalsSpec(_Strict):
    """`refusals.repeated` is sent when one user is refused by one rule more than
    `more_than` times within `within` (a fixed window, counted across the fleet)."""

    more_than: Annotated[StrictInt, Field(ge=1, le=1_000_000_000)] = 10
    within: RefusalWindow = 600_000


class NotificationsSpec(_Strict):
    webhooks: Annotated[list[WebhookSpec], Field(max_length=MAX_WEBHOOKS)] = Field(
        default_factory=list
    )
    repeated_refusals: RepeatedRefusalsSpec = RepeatedRefusalsSpec()


def _integer_one(value: object) -> object:
    if type(value) is not int:  # YAML `true` and `1.0` are not version 1
        raise ValueError(f"Input should be 1, got {value!r}")
    return value


class PolicySpec(_Strict):
    version: Annotated[Literal[1], BeforeValidator(_integer_one)]
    defaults: DefaultsSpec = DefaultsSpec()
    groups: dict[Name, list[Name]] = Field(default_factory=dict)
    tools: dict[Name, ToolSpec] = Field(default_factory=dict)
    rules: list[RuleSpec] = Field(default_factory=list)
    overrides: list[OverrideSpec] = Field(default_factory=list)
    notifications: NotificationsSpec | None = None
    # Model prices that beat genai-prices', by model name or glob (docs/budgets.md).
    models: Annotated[dict[Name, ModelPriceSpec], Field(max_length=1000)] = Field(
        default_factory=dict
    )
