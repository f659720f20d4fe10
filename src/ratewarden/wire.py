"""The v1 HTTP API's request and response bodies.

Shared by the service and the client, and free of server imports, so a host agent can
load the client without FastAPI or Redis. `args` are accepted but never stored or logged.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AliasChoices, BaseModel, ConfigDict, Field, StrictBool

Subject = Annotated[str, Field(min_length=1, max_length=256)]


def _no_control_characters(value: str) -> str:
    if any(unicodedata.category(char) == "Cc" for char in value):
        # A newline could never reach the settle route: the call could not be settled.
        raise ValueError("must not contain control characters: it travels in the settle URL")
    return value


CallId = Annotated[
    str,
    Field(min_length=1, max_length=128, json_schema_extra={"pattern": r"^[^\x00-\x1f\x7f-\x9f]+$"}),
    AfterValidator(_no_control_characters),
]
Tag = Annotated[str, Field(min_length=1, max_length=64)]
MAX_BATCH = 100
# `args` only ever reach the audit log (when enabled): bounded so that no call can make an
# audit entry, the recent-denials list or its serialisation blow up.
MAX_ARGS_BYTES = 64 * 1024  # as compact UTF-8 JSON
MAX_ARGS_DEPTH = 32  # {"a": 1} is 1 level, {"a": {"b": [1]}} is 3


def _nesting(value: Any) -> int:
    """How deep `value`'s objects and arrays go, stopping early past the cap (no recursion)."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending and deepest <= MAX_ARGS_DEPTH:
        item, level = pending.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, level)
            pending.extend((child, level + 1) for child in item)
    return deepest


def _bounded_args(value: dict[str, Any]) -> dict[str, Any]:
    if _nesting(value) > MAX_ARGS_DEPTH:
        raise ValueError(f"nested deeper than {MAX_ARGS_DEPTH} levels")
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_ARGS_BYTES:
        raise ValueError(f"larger than {MAX_ARGS_BYTES} bytes as JSON (got {size})")
    return value


Args = Annotated[
    dict[str, Any],
    AfterValidator(_bounded_args),
    Field(
        description=f"the tool's arguments, for the audit log only: at most {MAX_ARGS_DEPTH} "
        f"levels deep and {MAX_ARGS_BYTES} bytes as JSON"
    ),
]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def _hint(name: str, mcp: str) -> Any:
    return Field(None, validation_alias=AliasChoices(name, mcp))


class ToolMetadata(_Body):
    """What the caller knows about the tool; MCP annotation names are accepted too."""

    read_only: StrictBool | None = _hint("read_only", "readOnlyHint")
    destructive: StrictBool | None = _hint("destructive", "destructiveHint")
    idempotent: StrictBool | None = _hint("idempotent", "idempotentHint")
    open_world: StrictBool | None = _hint("open_world", "openWorldHint")
    requires_confirmation: StrictBool | None = None
    tags: Annotated[list[Tag], Field(max_length=32)] = []
    title: Annotated[str, Field(max_length=256)] | None = None  # MCP; ignored


class CheckRequest(_Body):
    user: Subject
    tool: Subject
    session: Subject | None = None
    team: Subject | None = None
    call_id: CallId | None = None
    cost: Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False, strict=True)] | None = None
    metadata: ToolMetadata | None = None
    args: Args | None = None
    approved: StrictBool = False


class BatchRequest(_Body):
    calls: Annotated[list[CheckRequest], Field(min_length=1, max_length=MAX_BATCH)]


Number = int | float  # calls and slots are counted in integers, money in decimals


class Violation(BaseModel):
    rule: str
    kind: str  # rate, concurrency, budget, unavailable
    limit: Number
    window: str | None = None
    remaining: Number
    retry_after: float | None = None
    message: str
    spent: float | None = None  # budgets
    reserved: float | None = None
    currency: str | None = None
    period: str | None = None


class LimitState(BaseModel):
    rule: str
    kind: str
    limit: Number
    window: str | None = None
    remaining: Number
    reset_after: float
    spent: float | None = None  # budgets
    reserved: float | None = None
    currency: str | None = None
    period: str | None = None


class CheckResponse(BaseModel):
    decision: Literal["allow", "deny", "ask"]
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


class UsageResponse(BaseModel):
    user: str
    tool: str | None = None
    session: str | None = None
    team: str | None = None
    limits: list[UsageItem]


class SettleRequest(_Body):
    cost: Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False, strict=True)] | None = None
    status: Annotated[str, Field(min_length=1, max_length=32)] | None = None  # ok, error...
    duration_ms: Annotated[float, Field(ge=0, allow_inf_nan=False, strict=True)] | None = None


class SettleResponse(BaseModel):
    call_id: str
    outcome: Literal["settled", "already_settled"]
    charged: dict[str, float] = {}  # budget rule -> amount charged by this settle


class ResetRequest(_Body):
    user: Subject | None = None
    rule: Annotated[str, Field(min_length=1, max_length=64)] | None = None


class ResetResponse(BaseModel):
    deleted: int


class DenialsResponse(BaseModel):
    """Audit entries: id, time, event (deny, ask, shadow_deny, approved), decision, user,
    tool, session, team, call_id, rule, rules, reason, message, retry_after, degraded
    (and args, when the operator enabled them)."""

    denials: list[dict[str, Any]]


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
