"""The policy file's shape, as pydantic models (what the YAML may say).

These models only check each field on its own; `compile.py` checks how fields relate
(rule names, groups, overrides) and builds the runtime `Policy`.
"""

from __future__ import annotations

import zoneinfo
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    StrictBool,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ratewarden.policy.durations import Rate, parse_rate
from ratewarden.policy.messages import compile_template

Name = Annotated[str, Field(min_length=1, max_length=256)]


def _listify(value: object) -> object:
    return [value] if isinstance(value, str) else value


# `tool: terminal` or `tool: [terminal, shell]`; a list either way, so errors name the item.
Names = Annotated[list[Name], BeforeValidator(_listify)]
RuleName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
RateText = Annotated[Rate, PlainValidator(parse_rate), PlainSerializer(str)]
Dimension = Literal["user", "tool", "session", "team"]
Mode = Literal["enforce", "shadow"]
FailMode = Literal["open", "closed"]
AlgorithmName = Literal["sliding_window", "token_bucket", "fixed_window"]

# Exact sliding windows keep one timestamp per unit of limit (6 bytes each); above this
# use token_bucket or fixed_window, whose memory does not grow with the limit.
MAX_SLIDING_LIMIT = 100_000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DefaultsSpec(_Strict):
    mode: Mode = "enforce"
    fail: FailMode = "open"
    algorithm: AlgorithmName = "sliding_window"
    timezone: str = "UTC"

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value: str) -> str:
        try:
            zoneinfo.ZoneInfo(value)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown timezone {value!r}") from None
        return value


class ToolSpec(_Strict):
    label: Name | None = None
    cost: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0


class MatchSpec(_Strict):
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


class RuleSpec(_Strict):
    name: RuleName
    match: MatchSpec = MatchSpec()
    per: list[Dimension] = Field(default_factory=lambda: list[Dimension](["user"]))
    rate: RateText | None = None
    concurrency: Annotated[int, Field(ge=0)] | None = None
    budget: str | None = None
    algorithm: AlgorithmName | None = None
    burst: Annotated[int, Field(ge=1)] | None = None
    mode: Mode | None = None
    on_exceed: Literal["deny", "ask"] = "deny"
    fail: FailMode | None = None
    label: Name | None = None
    message: str | None = None

    @field_validator("per")
    @classmethod
    def _unique_dimensions(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"lists a dimension twice: {value}")
        return value

    @field_validator("concurrency", "budget")
    @classmethod
    def _not_yet(cls, value: object, info: ValidationInfo) -> object:
        # Budgets and concurrency caps need reservations and leases in the engine; until
        # they exist a rule using them is refused rather than silently not enforced.
        raise ValueError(f"{info.field_name} rules are not supported by this version yet")

    @field_validator("message")
    @classmethod
    def _valid_template(cls, value: str | None) -> str | None:
        if value is not None:
            compile_template(value)
        return value

    @model_validator(mode="after")
    def _one_limit(self) -> RuleSpec:
        given = [k for k in ("rate", "concurrency", "budget") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "a rule needs exactly one of rate, concurrency, budget"
                + (f" (got {', '.join(given)})" if given else "")
            )
        if self.burst is not None and self.algorithm != "token_bucket":
            raise ValueError("burst only applies to algorithm: token_bucket")
        if (
            self.rate
            and self.rate.limit > MAX_SLIDING_LIMIT
            and self.algorithm
            in (
                None,
                "sliding_window",
            )
        ):
            raise ValueError(
                f"sliding_window limits are capped at {MAX_SLIDING_LIMIT} calls per window; "
                "use token_bucket or fixed_window for larger limits"
            )
        return self


class OverrideSpec(_Strict):
    users: list[Name] | None = None
    groups: list[Name] | None = None
    rule: RuleName
    rate: RateText | None = None
    concurrency: Annotated[int, Field(ge=0)] | None = None
    budget: str | None = None
    burst: Annotated[int, Field(ge=1)] | None = None
    unlimited: StrictBool = False

    @model_validator(mode="after")
    def _who_and_what(self) -> OverrideSpec:
        if not self.users and not self.groups:
            raise ValueError("an override needs users or groups")
        given = [k for k in ("rate", "concurrency", "budget") if getattr(self, k) is not None]
        if self.unlimited and given:
            raise ValueError(f"unlimited: true cannot be combined with {', '.join(given)}")
        if not self.unlimited and len(given) != 1 and self.burst is None:
            raise ValueError("an override needs one of rate, concurrency, budget, unlimited")
        return self


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
