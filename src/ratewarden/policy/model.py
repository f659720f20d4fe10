"""The compiled policy: what the engine consults for every call.

Everything that can be worked out once is worked out at load: globs are compiled,
overrides are indexed by precedence, and the rules that can apply to a (user, tool)
pair are cached, so deciding a call does no parsing and little allocation.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, ClassVar, Protocol
from zoneinfo import ZoneInfo

from ratewarden.arguments import cut_overlaps
from ratewarden.calls import Call, ToolFacts
from ratewarden.policy.conditions import ArgCondition
from ratewarden.policy.durations import Budget, Rate
from ratewarden.policy.errors import PolicyIssue
from ratewarden.policy.messages import Template
from ratewarden.policy.periods import Bounds, PeriodClock
from ratewarden.policy.prices import Prices
from ratewarden.vocabulary import (
    METADATA_FLAGS,
    Algorithm,
    CallKind,
    FailMode,
    Mode,
    OnExceed,
    RuleKind,
)
from ratewarden.wire import tools
from ratewarden.wire.bodies import ModelUsage
from ratewarden.wire.tools import Canonical, HostTool

# The policy's enums are the vocabulary's (one spelling for the file, the model, the API);
# they are named here too, beside the types that hold them.
__all__ = [
    "AccessLimit",
    "Algorithm",
    "Applied",
    "Bounded",
    "BudgetLimit",
    "CompiledOverride",
    "ConcurrencyLimit",
    "Explanation",
    "Glob",
    "Limit",
    "Match",
    "Mode",
    "NameSet",
    "OnExceed",
    "Overrides",
    "Policy",
    "RateLimit",
    "Rule",
    "ToolEntry",
    "ToolNames",
    "Unlimited",
    "compile_glob",
    "is_glob",
]

# (user, tool) pairs whose candidate rules are remembered; bounded so that a flood of
# distinct users cannot grow memory without limit.
_CANDIDATE_CACHE_SIZE = 65_536


@dataclass(frozen=True, slots=True)
class NameSet:
    """Exact names and globs (`browser_*`), matched case-sensitively."""

    exact: frozenset[str]
    globs: tuple[Glob, ...]
    source: tuple[str, ...]

    @classmethod
    def of(cls, patterns: str | Iterable[str]) -> NameSet:
        items = (patterns,) if isinstance(patterns, str) else tuple(patterns)
        globs = tuple(compile_glob(p) for p in items if is_glob(p))
        return cls(frozenset(p for p in items if not is_glob(p)), globs, items)

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        return name in self.exact or any(g.match(name) for g in self.globs)


def is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


class Glob(Protocol):
    def match(self, name: str, /) -> object: ...


def compile_glob(pattern: str) -> Glob:
    """`pattern` (`team-*`, `*-bot`, `a?[bc]`) as a matcher of whole names.

    The common glob, `*` and nothing else, is a `StarGlob`: a compiled regular expression
    costs about 100 µs, and 1 000 overrides may name 100 glob users each (a daemon
    compiles them at start and on a reload of the file). Others compile as fnmatch does.
    (Counted by tests/service/test_overrides.py.)"""
    if "?" in pattern or "[" in pattern or "*" not in pattern:
        return re.compile(fnmatch.translate(pattern))
    return StarGlob(pattern)


class StarGlob:
    """A glob whose only wildcard is `*`: its literal pieces, found left to right (the
    leftmost place of each piece leaves the most room for the next, so it is exact)."""

    __slots__ = ("_head", "_least", "_middle", "_tail", "pattern")

    def __init__(self, pattern: str) -> None:
        head, *middle, tail = pattern.split("*")
        self.pattern, self._head, self._tail = pattern, head, tail
        self._middle = tuple(piece for piece in middle if piece)
        self._least = len(pattern) - pattern.count("*")

    def match(self, name: str) -> bool:
        if len(name) < self._least or not name.startswith(self._head):
            return False
        end = len(name) - len(self._tail)
        if not name.endswith(self._tail):
            return False
        at = len(self._head)
        for piece in self._middle:
            at = name.find(piece, at, end)
            if at < 0:
                return False
            at += len(piece)
        return True


def _matching_glob(names: NameSet, tool: str) -> str:
    """The pattern, as written in the policy, that matched `tool` (not an exact name)."""
    return next(p for p in names.source if is_glob(p) and fnmatch.fnmatchcase(tool, p))


@dataclass(frozen=True, slots=True)
class RateLimit:
    kind: ClassVar[RuleKind] = RuleKind.RATE
    rate: Rate
    algorithm: Algorithm
    burst: int | None = None
    # A loop rule keyed on results: a settle whose result differs from the last restarts
    # the count (docs/policy.md, loops).
    same_result: bool = False

    @property
    def limit(self) -> int:
        return self.rate.limit


@dataclass(frozen=True, slots=True)
class BudgetLimit:
    kind: ClassVar[RuleKind] = RuleKind.BUDGET
    budget: Budget
    currency: str
    soft_limit: float | None  # share of the budget at which calls are flagged

    @property
    def limit(self) -> int:
        return self.budget.micros


@dataclass(frozen=True, slots=True)
class ConcurrencyLimit:
    kind: ClassVar[RuleKind] = RuleKind.CONCURRENCY
    slots: int
    lease_ms: int  # a slot whose call never settles returns after this long

    @property
    def limit(self) -> int:
        return self.slots


@dataclass(frozen=True, slots=True)
class AccessLimit:
    """An access rule (`deny: "..."` or `ask: "..."`): every call it covers is refused
    with its text, or asked about; no counter, nothing in the store."""

    kind: ClassVar[RuleKind] = RuleKind.ACCESS
    answer: OnExceed  # deny, or ask (which `approved: true` passes)

    @property
    def limit(self) -> int:
        return 0


@dataclass(frozen=True, slots=True)
class Unlimited:
    """`unlimited: true` in an override: the rule does not apply to these users."""


Counted = RateLimit | BudgetLimit | ConcurrencyLimit
Bounded = Counted | AccessLimit
Limit = Bounded | Unlimited


TOOL_CALLS = frozenset({CallKind.TOOL})  # what a rule's match covers when it says nothing
MODEL_CALLS = frozenset({CallKind.MODEL})


@dataclass(frozen=True, slots=True)
class Match:
    """Which calls a rule applies to; `None` fields match everything."""

    # The kinds of call (vocabulary.CallKind) it covers: a rule's match says tool calls
    # unless it states otherwise (compile.py); None (an `unless:`): any kind.
    kinds: frozenset[str] | None = None
    models: NameSet | None = None  # a model call's model (its `tool`)
    tools: NameSet | None = None
    users: NameSet | None = None
    groups: frozenset[str] | None = None
    sessions: NameSet | None = None
    teams: NameSet | None = None
    metadata: tuple[tuple[str, bool], ...] = ()
    tags: frozenset[str] | None = None
    args: tuple[ArgCondition, ...] = ()  # all must hold (SPEC 2.1)
    # How a condition on an argument the client had to cut reads (`Call.args_cut`): as
    # holding in a rule's `match`, so a refusing or counting rule still applies, and as
    # failing in its `unless:`, so nothing is excused on what could not be read.
    cut_holds: bool = True

    def static_mismatch(
        self,
        user: str,
        tool: str,
        groups: frozenset[str],
        host_tool: str | None = None,
        kind: str = CallKind.TOOL,
    ) -> str | None:
        """Why the rule cannot apply to this user and tool (by its canonical name or the
        host's own, `host_tool`) or model (`kind` model), or None if it may."""
        if self.kinds is not None and kind not in self.kinds:
            return f"it covers {' and '.join(sorted(self.kinds))} calls, not {kind} calls"
        models = self.models
        if models is not None and tool not in models:
            return f"model {tool!r} is not in {list(models.source)}"
        tools = self.tools
        if (
            tools is not None
            and tool not in tools
            and (host_tool is None or host_tool not in tools)
        ):
            named = f"tool {tool!r}" + (f" (the host's {host_tool!r})" if host_tool else "")
            return f"{named} is not in {list(tools.source)}"
        if self.users is not None and user not in self.users:
            return f"user {user!r} is not in {list(self.users.source)}"
        if self.groups is not None and not self.groups & groups:
            return f"user is in none of the groups {sorted(self.groups)}"
        return None

    def could_apply(
        self,
        user: str,
        tool: str | None,
        groups: frozenset[str],
        session: str | None,
        team: str | None,
    ) -> bool:
        """Whether the rule may apply to calls of this user; unknown parts match anything."""
        return (
            (self.tools is None or tool is None or tool in self.tools)
            and (self.users is None or user in self.users)
            and (self.groups is None or bool(self.groups & groups))
            and (self.sessions is None or session is None or session in self.sessions)
            and (self.teams is None or team is None or team in self.teams)
        )

    @property
    def has_call_conditions(self) -> bool:
        """Whether `call_mismatch` can refuse a call (session, team, metadata, tags, args)."""
        return not (
            self.sessions is None
            and self.teams is None
            and not self.metadata
            and self.tags is None
            and not self.args
        )

    def call_test(self) -> Callable[[Call], bool] | None:
        """`holds_for_call`, compiled: None when nothing but user and tool decides, and
        for conditions on `args` alone (the common per-call case) a loop over each
        condition's path and test, bound once, with nothing else to look at."""
        if not self.has_call_conditions:
            return None
        if self.sessions or self.teams or self.metadata or self.tags is not None:
            return self.holds_for_call
        pairs = tuple((c.path.resolver(), c.condition.holds) for c in self.args)
        with_cut = self.holds_for_call  # the rare call whose args were cut
        if len(pairs) == 1:  # the usual rule: one condition, no loop
            [(resolve, holds)] = pairs
            return lambda call: with_cut(call) if call.args_cut else holds(resolve(call.args))

        def args_hold(call: Call) -> bool:
            if call.args_cut:
                return with_cut(call)
            args = call.args
            for resolve, holds in pairs:  # noqa: SIM110 - a loop: no generator per call
                if not holds(resolve(args)):
                    return False
            return True

        return args_hold

    def holds_for_call(self, call: Call) -> bool:
        """`call_mismatch(call) is None`, without wording why: what every call asks."""
        if self.sessions is not None and call.session not in self.sessions:
            return False
        if self.teams is not None and call.team not in self.teams:
            return False
        facts = call.facts
        for name, wanted in self.metadata:
            if facts.effective(name) is not wanted:
                return False
        if self.tags is not None and not self.tags & facts.tags:
            return False
        for condition in self.args:  # noqa: SIM110 - a loop: no generator on every call
            if not self._arg_holds(condition, call):
                return False
        return True

    def _arg_holds(self, condition: ArgCondition, call: Call) -> bool:
        if call.args_cut and cut_overlaps(condition.path.steps, call.args_cut):
            return self.cut_holds
        return condition.holds(call.args)

    def matches(self, call: Call, groups: frozenset[str]) -> bool:
        """Whether every condition holds for `call` (`unless:` asks this)."""
        return (
            self.static_mismatch(call.user, call.tool, groups, call.host_tool, call.kind) is None
            and self.call_mismatch(call) is None
        )

    def conditions(self, call: Call, groups: frozenset[str]) -> list[tuple[str, bool]]:
        """Each condition this match states, described, and whether it holds for `call`
        (all of them, for `policy explain`; deciding stops at the first that fails)."""
        held = self._kind_held(call)
        if self.tools is not None:
            host_tool = call.host_tool
            held.append(
                call.tool in self.tools or (host_tool is not None and host_tool in self.tools)
            )
        for names, value in (
            (self.users, call.user),
            (self.sessions, call.session),
            (self.teams, call.team),
        ):
            if names is not None:
                held.append(value in names)
        if self.groups is not None:
            held.append(bool(self.groups & groups))
        held.extend(call.facts.effective(name) is wanted for name, wanted in self.metadata)
        if self.tags is not None:
            held.append(bool(self.tags & call.facts.tags))
        said = " (cut to send: read as " + ("holding)" if self.cut_holds else "failing)")
        texts = self.stated_parts()
        first_arg = len(texts) - len(self.args)
        for condition, index in zip(self.args, range(first_arg, len(texts)), strict=True):
            held.append(self._arg_holds(condition, call))
            if call.args_cut and cut_overlaps(condition.path.steps, call.args_cut):
                texts[index] += said
        return list(zip(texts, held, strict=True))

    def _kind_held(self, call: Call) -> list[bool]:
        """`conditions`' first: whether the call is of the kind and model stated."""
        held = []
        if self.kinds is not None and self.kinds != TOOL_CALLS:  # as stated_parts says them
            held.append(call.kind in self.kinds)
        if self.models is not None:
            held.append(call.tool in self.models)
        return held

    def stated_parts(self) -> list[str]:
        """Each condition this match states, in `policy explain`'s words and order."""
        found: list[str] = []
        if self.kinds is not None and self.kinds != TOOL_CALLS:  # the default goes unsaid
            found.append(f"kind in {sorted(map(str, self.kinds))}")  # the values, not the enum
        if self.models is not None:
            found.append(f"model in {list(self.models.source)}")
        if self.tools is not None:
            found.append(f"tool in {list(self.tools.source)}")
        for name, names in (("user", self.users), ("session", self.sessions), ("team", self.teams)):
            if names is not None:
                found.append(f"{name} in {list(names.source)}")
        if self.groups is not None:
            found.append(f"group in {sorted(self.groups)}")
        found.extend(f"{name} is {wanted}" for name, wanted in self.metadata)
        if self.tags is not None:
            found.append(f"tags include one of {sorted(self.tags)}")
        found.extend(f"args.{c.path.text} {c.condition.describe()}" for c in self.args)
        return found

    def stated(self) -> str | None:
        """What this match asks, with no call: the `condition` a refusal by its rule
        carries (worked out once, at load). None: it asks nothing (every call is covered)."""
        return " and ".join(self.stated_parts()) or None

    def call_mismatch(self, call: Call) -> str | None:
        """Why the rule does not apply given the call's session, team and metadata."""
        if self.sessions is not None and call.session not in self.sessions:
            return f"session {call.session!r} is not in {list(self.sessions.source)}"
        if self.teams is not None and call.team not in self.teams:
            return f"team {call.team!r} is not in {list(self.teams.source)}"
        for name, wanted in self.metadata:
            if call.facts.effective(name) is not wanted:
                said = getattr(call.facts, name)
                origin = "given" if said is not None else "unclassified default"
                return f"{name} is {call.facts.effective(name)} ({origin}), rule wants {wanted}"
        if self.tags is not None and not self.tags & call.facts.tags:
            return f"call has none of the tags {sorted(self.tags)}"
        for condition in self.args:
            if not self._arg_holds(condition, call):
                if call.args_cut and cut_overlaps(condition.path.steps, call.args_cut):
                    return f"args.{condition.path.text} was cut to send: it excuses nothing"
                return condition.mismatch(call.args)
        return None


def _surely_excluded(
    unless: Match | None, user: str, tool: str | None, groups: frozenset[str]
) -> bool:
    """Whether `unless:` excludes every call of this user (and tool, if known): nothing
    it states depends on the call, and all of it holds."""
    if unless is None or unless.has_call_conditions:
        return False
    if unless.tools is not None and tool is None:
        return False  # it names tools, and which one is not known
    return unless.static_mismatch(user, tool or "", groups) is None


@dataclass(frozen=True, slots=True)
class CompiledOverride:
    """One override (the file's or a runtime one) compiled against one policy file: its
    entries for each level of `Overrides`, or why it cannot apply (`idle`). Kept on the
    policy, so that a change of the runtime overrides compiles only the ones it adds."""

    spec: Any  # the schema.OverrideSpec it was compiled from
    rule: str
    exact: dict[str, tuple[Limit, str]] = field(default_factory=dict)
    groups: tuple[tuple[str, Limit, str], ...] = ()
    globs: tuple[tuple[Glob, Limit, str], ...] = ()
    idle: str | None = None  # "field: why" when it does not fit the file


@dataclass(frozen=True, slots=True)
class Overrides:
    """Per-user limits for one rule, by precedence: exact user > group > glob."""

    exact: dict[str, tuple[Limit, str]] = field(default_factory=dict)
    groups: tuple[tuple[str, Limit, str], ...] = ()
    globs: tuple[tuple[Glob, Limit, str], ...] = ()

    def find(self, user: str, groups: frozenset[str]) -> tuple[Limit, str] | None:
        """The override for `user` and where it came from; first in file order wins a tie."""
        if user in self.exact:
            return self.exact[user]
        for group, limit, origin in self.groups:
            if group in groups:
                return limit, origin
        for pattern, limit, origin in self.globs:
            if pattern.match(user):
                return limit, origin
        return None


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    index: int
    match: Match
    per: tuple[str, ...]
    limit: Bounded
    mode: Mode
    on_exceed: OnExceed
    fail: FailMode | None  # None: the daemon's FAIL setting, else the policy default
    label: str | None
    template: Template
    overrides: Overrides = field(default_factory=Overrides)
    unless: Match | None = None  # calls it matches are not covered
    # What its `match` asks of a call (`Match.stated`), for an access rule or one on
    # `args`: the `condition` its refusals carry. None for any other.
    condition: str | None = field(init=False, compare=False)

    def __post_init__(self) -> None:  # frozen: worked out once, here
        said = self.match.stated() if self.match.args or self.kind is RuleKind.ACCESS else None
        object.__setattr__(self, "condition", said)

    @property
    def kind(self) -> RuleKind:
        """`rate`, `budget`, `concurrency` or `access`: its limit's kind."""
        return self.limit.kind

    @property
    def asks_user(self) -> bool:
        """Whether who the user is can change whether, or with which limit, it applies:
        a `users:` or `groups:` in its match or `unless:`, or an override."""
        said = (self.match, self.unless) if self.unless is not None else (self.match,)
        overrides = self.overrides
        return any(m.users is not None or m.groups is not None for m in said) or bool(
            overrides.exact or overrides.groups or overrides.globs
        )

    @property
    def reads_args(self) -> bool:
        """Whether deciding a call under this rule needs the call's `args`."""
        unless = self.unless.args if self.unless is not None else ()
        return bool(self.match.args or unless) or any(dim.startswith("args") for dim in self.per)

    @property
    def algorithm(self) -> str:
        return self.limit.algorithm if isinstance(self.limit, RateLimit) else self.kind


@dataclass(frozen=True, slots=True)
class Applied:
    """A rule that applies to a call, with the limit in force for this user."""

    rule: Rule
    limit: Limit
    source: str  # "rule" or the override that set the limit, e.g. "overrides[0]"
    # Its `unless:` matches this user and tool, and only the call can tell whether the
    # rest of it does too (when the rest is nothing, the rule is no candidate at all).
    check_unless: bool = False
    # Whether the call's own parts (session, team, metadata, args) bring it under the
    # rule, once user and tool did; None for most rules: nothing left to ask the call.
    covers: Callable[[Call], bool] | None = field(init=False, compare=False)

    def __post_init__(self) -> None:  # frozen: worked out once, here
        object.__setattr__(self, "covers", _covers(self.rule, self.check_unless))


def _covers(rule: Rule, check_unless: bool) -> Callable[[Call], bool] | None:
    matched = rule.match.call_test()
    unless = rule.unless.call_test() if check_unless and rule.unless is not None else None
    if unless is None:
        return matched
    if matched is None:
        return lambda call: not unless(call)
    return lambda call: matched(call) and not unless(call)


@dataclass(frozen=True, slots=True)
class ToolEntry:
    label: str | None
    cost: float
    facts: ToolFacts | None = None  # what the catalogue says the tool is (None: nothing)


@dataclass(frozen=True, slots=True)
class ToolNames:
    """The policy's own lines of the tool table (`tools: {NAME: {same_as: ..., host: ...,
    args: ...}}`), in force before the built-in one (wire/tools.py): a line for the call's
    host and tool, else a line for the tool on any host (or none), else the built-in
    row. One step: the policy refuses a line whose `same_as` is another line's name."""

    lines: Mapping[tuple[str | None, str], HostTool]  # (host or None: any, tool) -> it

    def canonical(self, host: str | None, tool: str, args: Any = None) -> Canonical:
        """`tool` (and its `args`) as `host` calls it, in the policy's canonical terms."""
        lines = self.lines
        found = (lines.get((host, tool)) if host is not None else None) or lines.get((None, tool))
        if found is None:
            return tools.canonical(host, tool, args)
        return tools.as_known(found, tool, args)


BUILT_IN_NAMES = ToolNames({})  # a policy without `same_as` lines: the built-in table only


@dataclass(frozen=True, slots=True)
class Explanation:
    rule: Rule
    applies: bool
    reason: str
    limit: Limit | None
    source: str | None
    conditions: tuple[tuple[str, bool], ...] = ()  # every condition, and whether it held


@dataclass(frozen=True, slots=True)
class Webhook:
    """Where a notification goes (policy `notifications.webhooks`, or the settings'
    RATEWARDEN_WEBHOOK_URL): a URL, or the environment variable holding it, and the
    variable holding its signing secret. Variables are read by the daemon, never kept in
    the policy."""

    url: str | None
    url_env: str | None
    secret_env: str | None
    events: frozenset[str]


@dataclass(frozen=True, slots=True)
class Notifications:
    """The policy's `notifications:` section, compiled (none: no webhooks, the defaults)."""

    webhooks: tuple[Webhook, ...] = ()
    refusals_over: int = 10  # `repeated_refusals.more_than`
    refusals_window_ms: int = 600_000  # `repeated_refusals.within`

    @classmethod
    def of(cls, section: Any) -> Notifications:
        """The compiled form of a `schema.NotificationsSpec` (None: the defaults)."""
        if section is None:
            return cls()
        return cls(
            webhooks=tuple(
                Webhook(hook.url, hook.url_env, hook.secret_env, frozenset(hook.events))
                for hook in section.webhooks
            ),
            refusals_over=section.repeated_refusals.more_than,
            refusals_window_ms=section.repeated_refusals.within,
        )


# Slotted: a Policy's attributes are read on every decision, and a slotted one's by index
# however many it has (a dict's only while under 30: service/metrics.py, MAX_ATTRIBUTES).
@dataclass(eq=False, slots=True)
class Policy:
    """A loaded, validated policy. Immutable once built; reloads build a new one."""

    version: str
    source: str
    defaults: dict[str, str]
    groups: dict[str, NameSet]
    tools: tuple[tuple[NameSet, ToolEntry], ...]
    default_tool: ToolEntry
    rules: tuple[Rule, ...]
    document: dict[str, Any]  # the normalised file, served by GET /v1/policy
    timezone: ZoneInfo = field(default_factory=lambda: ZoneInfo("UTC"))
    reservation_ttl_ms: int = 3_600_000
    call_ttl_ms: int = 3_600_000
    # Runtime overrides left out because they no longer fit the file: id -> why.
    idle_overrides: dict[str, str] = field(default_factory=dict)
    # The catalogue's `same_as` lines, None without any (only the built-in table maps).
    names: ToolNames | None = None
    # What `policy check` warns of (policy/toolnames.py), each with its line: the loader's.
    warnings: tuple[PolicyIssue, ...] = ()
    # The validated file (a schema.PolicySpec), compiled again with other runtime overrides.
    spec: Any = field(default=None, repr=False, compare=False)
    # Its overrides compiled, the file's in file order and the runtime ones by id (newest
    # first): what a change of the runtime overrides reuses (policy/compile.py).
    file_overrides: tuple[CompiledOverride, ...] = field(default=(), repr=False, compare=False)
    runtime_overrides: dict[str, CompiledOverride] = field(
        default_factory=dict, repr=False, compare=False
    )
    # Model calls' prices (the `models:` lines, genai-prices, `defaults.model_price`) and
    # the output a call that names no maximum reserves (docs/budgets.md).
    prices: Prices = field(default_factory=Prices, repr=False, compare=False)
    max_output_tokens: int = 4096
    _periods: dict[str, PeriodClock] = field(init=False, repr=False)
    _metric_tool: Callable[[str], str] = field(init=False, repr=False)
    _by_name: dict[str, Rule] = field(init=False, repr=False)
    _call_conditions: bool = field(init=False, repr=False)  # does any rule look past user/tool?
    _named_tools: frozenset[str] = field(init=False, repr=False)
    _candidates: Callable[[str, str], tuple[Applied, ...]] = field(init=False, repr=False)
    # A call whose host named the tool otherwise: by (user, tool, host_tool), asked only
    # when some rule names that host's name (`_names_tool`); else as (user, tool).
    _hosted: Callable[[str, str, str], tuple[Applied, ...]] = field(init=False, repr=False)
    _names_tool: Callable[[str], bool] = field(init=False, repr=False)
    _asks_user: bool = field(init=False, repr=False)  # may who the user is change a rule?
    _model_candidates: Callable[[str, str], tuple[Applied, ...]] = field(init=False, repr=False)
    _metric_model: Callable[[str], str] = field(init=False, repr=False)
    _shared_candidates: dict[tuple[tuple[int, int, str, bool], ...], tuple[Applied, ...]] = field(
        init=False, repr=False
    )
    _label: Callable[[str], str] = field(init=False, repr=False)
    # Does any rule read the call's `args`? Clients send them exactly when it does.
    reads_args: bool = field(init=False)
    # A call's facts with the catalogue's filled in (`classified`); None when no catalogue
    # entry classifies a tool, so a call costs nothing more.
    tool_facts: Callable[[str, ToolFacts], ToolFacts] | None = field(init=False)
    _catalogue_facts: Callable[[str], ToolFacts | None] = field(init=False, repr=False)
    has_access_rules: bool = field(init=False)  # else no call needs the access gate

    def __post_init__(self) -> None:
        # Per-instance caches: a reloaded policy starts with empty ones.
        self._candidates = lru_cache(maxsize=_CANDIDATE_CACHE_SIZE)(self._find_candidates)
        self._hosted = lru_cache(maxsize=_CANDIDATE_CACHE_SIZE)(self._find_candidates)
        self._model_candidates = lru_cache(maxsize=_CANDIDATE_CACHE_SIZE)(self._find_for_model)
        # Rules that ask nothing of the user (`Rule.asks_user`) give every user of a tool
        # the same candidates: those caches are then keyed by the tool alone (the user
        # ""), not by (user, tool), where every new user's first call missed and resolved
        # every rule again (bench/instructions.py). Most policies count per user without
        # matching on one.
        self._asks_user = any(rule.asks_user for rule in self.rules)
        self._names_tool = lru_cache(maxsize=4096)(self._find_named_tool)
        self._metric_model = lru_cache(maxsize=4096)(self._find_metric_model)
        # Bounded by the policy: one entry per distinct set of rules and limits.
        self._shared_candidates = {}
        self._label = lru_cache(maxsize=4096)(self._find_label)
        self._catalogue_facts = lru_cache(maxsize=4096)(lambda tool: self._tool_entry(tool).facts)
        classifies = any(e.facts for _, e in self.tools) or self.default_tool.facts is not None
        self.tool_facts = self.classified if classifies else None
        self._metric_tool = lru_cache(maxsize=4096)(self._find_metric_tool)
        self._periods = {}
        self._by_name = {rule.name: rule for rule in self.rules}
        self._call_conditions = any(
            rule.match.has_call_conditions or rule.unless is not None for rule in self.rules
        )
        self.reads_args = any(rule.reads_args for rule in self.rules)
        self.has_access_rules = any(rule.kind is RuleKind.ACCESS for rule in self.rules)
        # Tools the policy names exactly: the only tool names that may become metric labels.
        self._named_tools = frozenset(
            name
            for names in [*(n for n, _ in self.tools), *(r.match.tools for r in self.rules)]
            if names is not None
            for name in names.exact
        )

    def period(self, name: str, now_ms: int) -> Bounds:
        """The budget period `name` (day, week...) containing `now_ms`, in the policy's zone."""
        clock = self._periods.get(name)
        if clock is None:
            clock = self._periods[name] = PeriodClock(name, self.timezone)
        return clock.at(now_ms)

    def applicable(self, call: Call) -> Sequence[Applied]:
        """The rules that apply to `call`, in policy order, with their effective limits
        (a rule an override makes unlimited for this user does not apply to them)."""
        host_tool = call.host_tool
        user = call.user if self._asks_user else ""  # see __post_init__
        if call.kind == CallKind.MODEL:
            candidates = self._model_candidates(user, call.tool)
        elif host_tool is None or not self._names_tool(host_tool):
            candidates = self._candidates(user, call.tool)
        else:  # a rule names the host's own name for the tool: it may apply too
            candidates = self._hosted(user, call.tool, host_tool)
        if not self._call_conditions:  # nothing but user and tool decides: all of them
            return candidates
        found = []  # a loop, not tuple(genexpr): this runs on every call
        for applied in candidates:
            covers = applied.covers
            if covers is None or covers(call):
                found.append(applied)
        return found

    def explain(self, call: Call) -> list[Explanation]:
        """For every rule: does it apply to `call`, why, with which limit, and how each
        of its conditions (`match`, then `unless`) came out."""
        groups = self.groups_of(call.user)
        result = []
        for rule in self.rules:
            conditions = rule.match.conditions(call, groups)
            unless = rule.unless
            if unless is not None:
                conditions += [
                    (f"unless {text}", held) for text, held in unless.conditions(call, groups)
                ]
            reason = rule.match.static_mismatch(call.user, call.tool, groups, call.host_tool)
            reason = reason or rule.match.call_mismatch(call)
            if not reason and unless is not None and unless.matches(call, groups):
                reason = "its unless: matches the call"
            if reason:
                result.append(Explanation(rule, False, reason, None, None, tuple(conditions)))
                continue
            limit, source = self._effective_limit(rule, call.user, groups)
            held = "all match conditions hold" + (", unless: does not" if unless else "")
            result.append(Explanation(rule, True, held, limit, source, tuple(conditions)))
        return result

    def for_usage(
        self, user: str, tool: str | None, session: str | None, team: str | None
    ) -> list[Applied]:
        """Rules whose counter for this user is known from the given parts (GET /v1/usage)."""
        given = {"user": user, "tool": tool, "session": session, "team": team}
        groups = self.groups_of(user)
        return [
            Applied(rule, *self._effective_limit(rule, user, groups))
            for rule in self._may_count(user, tool, session, team, groups)
            if all(given.get(dim) is not None for dim in rule.per)  # never args: not given
        ]

    def unshown_in_usage(
        self, user: str, tool: str | None, session: str | None, team: str | None
    ) -> list[tuple[str, tuple[str, ...]]]:
        """Rules that may count this user's calls but that `for_usage` leaves out, since
        their counter needs a part not given: each with those parts (tool, session, team).
        A rule counted per call arguments is never shown, and not listed either."""
        given = {"user": user, "tool": tool, "session": session, "team": team}
        groups = self.groups_of(user)
        unshown = []
        for rule in self._may_count(user, tool, session, team, groups):
            missing = tuple(dim for dim in rule.per if given.get(dim, "args") is None)
            if missing and all(dim in given for dim in rule.per):
                unshown.append((rule.name, missing))
        return unshown

    def _may_count(
        self,
        user: str,
        tool: str | None,
        session: str | None,
        team: str | None,
        groups: frozenset[str],
    ) -> list[Rule]:
        return [
            rule
            for rule in self.rules
            if rule.match.could_apply(user, tool, groups, session, team)
            and not _surely_excluded(rule.unless, user, tool, groups)
        ]

    def canonical(self, host: str | None, tool: str, args: Any = None) -> Canonical:
        """`tool` as `host` names it (None: a call that names no host), in canonical
        terms: the policy's `same_as` lines, then the built-in table (wire/tools.py)."""
        return (self.names or BUILT_IN_NAMES).canonical(host, tool, args)

    def groups_of(self, user: str) -> frozenset[str]:
        return frozenset(name for name, members in self.groups.items() if user in members)

    def label_for(self, tool: str) -> str:
        """The tool catalogue's label for `tool`, else the tool name itself."""
        return self._label(tool)

    def classified(self, tool: str, facts: ToolFacts) -> ToolFacts:
        """`facts` (the caller's), each flag it leaves unsaid taken from the catalogue."""
        known = self._catalogue_facts(tool)
        if known is None:
            return facts
        said = {name: getattr(facts, name) for name in METADATA_FLAGS}
        merged = {k: v if v is not None else getattr(known, k) for k, v in said.items()}
        return ToolFacts(**merged, tags=facts.tags)

    def cost_for(self, tool: str) -> float:
        return self._tool_entry(tool).cost

    def metric_tool(self, tool: str) -> str:
        """A bounded metric label: a tool the policy names, its catalogue label, or `other`."""
        return self._metric_tool(tool)

    @property
    def notifications(self) -> Notifications:
        """The file's `notifications:` section, compiled anew at each read (the notifier
        reads it once per file: service/notify.py). A property, not a field: a Policy's
        attributes are read on every decision, and CPython reads them by index only
        while an instance has fewer than 30 (service/metrics.py, MAX_ATTRIBUTES)."""
        return Notifications.of(self.spec.notifications if self.spec is not None else None)

    def most_cost(self, call: Call) -> int | None:
        """The most model call `call` can cost, in micro-USD (None: no price is known)."""
        price = self.prices.of(call.tool)
        if price is None:
            return None
        most = call.max_output_tokens
        return price.most(call.input_tokens, self.max_output_tokens if most is None else most)

    def usage_cost(self, model: str, usage: ModelUsage) -> int | None:
        """What `usage` of `model` cost, in micro-USD (None: no price is known)."""
        price = self.prices.of(model)
        return None if price is None else price.micros(usage)

    def metric_model(self, model: str) -> str:
        """A bounded metric label: the policy's pattern (a `models:` line, a rule's
        `model:`) that `model` matches, or `other`."""
        return self._metric_model(model)

    def _find_metric_model(self, model: str) -> str:
        lines = [*self.prices.exact, *(pattern for pattern, _ in self.prices.globs)]
        named = [p for r in self.rules if r.match.models is not None for p in r.match.models.source]
        for pattern in (*lines, *named):
            if pattern == model or (is_glob(pattern) and fnmatch.fnmatchcase(model, pattern)):
                return pattern
        return "other"

    def rule_named(self, rule_name: str) -> Rule | None:
        return self._by_name.get(rule_name)

    def currency_of(self, rule_name: str) -> str | None:
        rule = self._by_name.get(rule_name)
        return rule.limit.currency if rule and isinstance(rule.limit, BudgetLimit) else None

    def _find_metric_tool(self, tool: str) -> str:
        if tool in self._named_tools:
            return tool
        for catalogued, entry in self.tools:
            if tool in catalogued:
                return entry.label or _matching_glob(catalogued, tool)
        for rule in self.rules:
            matched = rule.match.tools
            if matched is not None and tool in matched:
                return rule.label or _matching_glob(matched, tool)
        return "other"

    def _find_named_tool(self, name: str) -> bool:
        """Whether a rule's `match` or `unless` names the tool `name` (a host's own)."""
        return any(
            names is not None and name in names
            for rule in self.rules
            for names in (rule.match.tools, rule.unless.tools if rule.unless else None)
        )

    def _find_for_model(self, user: str, model: str) -> tuple[Applied, ...]:
        return self._find_candidates(user, model, None, CallKind.MODEL)

    def _find_candidates(
        self, user: str, tool: str, host_tool: str | None = None, kind: str = CallKind.TOOL
    ) -> tuple[Applied, ...]:
        groups = self.groups_of(user)
        found = []
        for rule in self.rules:
            if rule.match.static_mismatch(user, tool, groups, host_tool, kind) is not None:
                continue
            unless = rule.unless
            check_unless = (
                unless is not None
                and unless.static_mismatch(user, tool, groups, host_tool, kind) is None
            )
            if check_unless and not unless.has_call_conditions:  # type: ignore[union-attr]
                continue  # its `unless:` holds for every call of this user and tool
            limit, source = self._effective_limit(rule, user, groups)
            if not isinstance(limit, Unlimited):  # lifted for this user: not theirs to apply
                found.append((rule, limit, source, check_unless))
        # Most (user, tool) pairs get the same rules and limits: the cache holds one
        # tuple per distinct answer rather than one per pair, so a full garbage collection
        # does not walk up to 65 536 copies (it stalled every request for 10-20 ms).
        key = tuple((id(rule), id(limit), source, unless) for rule, limit, source, unless in found)
        shared = self._shared_candidates.get(key)
        if shared is None:
            shared = self._shared_candidates[key] = tuple(Applied(*f) for f in found)
        return shared

    def limit_for(self, rule: Rule, user: str) -> Limit:
        """The limit of `rule` in force for `user`: an override's, else the rule's own."""
        return self._effective_limit(rule, user, self.groups_of(user))[0]

    @staticmethod
    def _effective_limit(rule: Rule, user: str, groups: frozenset[str]) -> tuple[Limit, str]:
        override = rule.overrides.find(user, groups)
        return override if override else (rule.limit, "rule")

    def _tool_entry(self, tool: str) -> ToolEntry:
        """Exact catalogue names first, then globs in file order, then `default`."""
        for names, entry in self.tools:
            if tool in names.exact:
                return entry
        for names, entry in self.tools:
            if any(glob.match(tool) for glob in names.globs):
                return entry
        return self.default_tool

    def _find_label(self, tool: str) -> str:
        return self._tool_entry(tool).label or tool
