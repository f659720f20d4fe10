"""Turn a field-checked `PolicySpec` into the runtime `Policy`.

This is where fields are checked against each other: unique rule names, groups that
exist, overrides that fit their rule. Every problem is collected, so `policy check`
reports them all at once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from zoneinfo import ZoneInfo

from ratewarden.arguments import ArgPath
from ratewarden.calls import ToolFacts
from ratewarden.policy.conditions import ArgCondition, compile_condition
from ratewarden.policy.errors import PolicyIssue
from ratewarden.policy.messages import Template, compile_template, default_template
from ratewarden.policy.model import (
    MODEL_CALLS,
    TOOL_CALLS,
    AccessLimit,
    Bounded,
    BudgetLimit,
    CompiledOverride,
    ConcurrencyLimit,
    Glob,
    Limit,
    Match,
    NameSet,
    Overrides,
    Policy,
    RateLimit,
    Rule,
    ToolEntry,
    Unlimited,
    compile_glob,
    is_glob,
)
from ratewarden.policy.prices import Prices, price_of
from ratewarden.policy.schema import (
    MatchSpec,
    OverrideSpec,
    PolicySpec,
    RuleSpec,
    ToolSpec,
    limits_in,
    sliding_cap_problem,
)
from ratewarden.policy.toolnames import compile_names
from ratewarden.vocabulary import (
    METADATA_FLAGS,
    REPEATED,
    SAME_RESULT,
    TOKEN_RATE,
    Algorithm,
    CallKind,
    Dimension,
    OnExceed,
    RuleKind,
)


def policy_version(raw: bytes) -> str:
    """A policy file's version: the first 16 hex digits of its bytes' SHA-256. What the
    daemon reports as the version in force, and what the reloader compares a changed file
    with (service/reload.py)."""
    return hashlib.sha256(raw).hexdigest()[:16]


def compile_policy(
    spec: PolicySpec,
    source: str,
    raw: bytes,
    runtime: Sequence[tuple[str, OverrideSpec]] = (),
    version: str | None = None,
) -> tuple[Policy | None, list[PolicyIssue]]:
    """Build the runtime policy, or return every issue found (and no policy).

    `runtime`: overrides set at run time (POST /v1/admin/overrides), each with its id.
    They go before the file's, so at each level of precedence (exact user, group, glob) a
    runtime override wins. One that no longer fits the file (its rule was removed, or is
    now of another kind) is left out, never a reason to refuse the file:
    `Policy.idle_overrides` says which and why. `version`: the file's, when `raw` is not
    the file (a recompile with other runtime overrides keeps the version it had)."""
    issues: list[PolicyIssue] = []  # names and groups were checked by references.py
    rules_by_name = {rule.name: rule for rule in spec.rules}
    mine = []
    for i, override in enumerate(spec.overrides):
        compiled, found = _compile_override(spec, rules_by_name, override, ("overrides", i))
        issues += found
        mine.append(compiled)
    names, found = compile_names(spec)
    issues += found
    prices = compile_prices(spec)
    issues += unpriced_models(spec, prices) + model_currencies(spec)
    if issues:
        return None, issues
    runtime_compiled = {
        override_id: compile_runtime_override(spec, override_id, override, rules_by_name)
        for override_id, override in runtime
    }
    overrides = _merge([*runtime_compiled.values(), *mine])
    rules = tuple(
        _compile_rule(spec, i, r, overrides.get(r.name)) for i, r in enumerate(spec.rules)
    )
    document = spec.model_dump(mode="json", exclude_none=True)
    policy = Policy(
        version=version or policy_version(raw),
        source=source,
        defaults=spec.defaults.model_dump(),
        groups={name: NameSet.of(members) for name, members in spec.groups.items()},
        tools=tuple(
            (NameSet.of(pattern), _tool_entry(entry))
            for pattern, entry in spec.tools.items()
            if pattern != "default" and entry.same_as is None  # a name, not a label or cost
        ),
        default_tool=_default_tool(spec),
        rules=rules,
        document=document,
        timezone=ZoneInfo(spec.defaults.timezone),
        reservation_ttl_ms=spec.defaults.reservation_ttl,
        call_ttl_ms=spec.defaults.call_ttl,
        idle_overrides=_idle(runtime_compiled),
        names=names,
        spec=spec,
        file_overrides=tuple(mine),
        runtime_overrides=runtime_compiled,
        prices=prices,
        max_output_tokens=spec.defaults.max_output_tokens,
    )
    return policy, []


def with_runtime(
    policy: Policy,
    runtime: Sequence[tuple[str, OverrideSpec]],
    compiled: Mapping[str, CompiledOverride] | None = None,
) -> Policy:
    """`policy` with these runtime overrides (newest first) instead of its own, compiling
    only the ones it has not compiled yet (nor `compiled`, ones compiled against this same
    file): its rules, conditions and messages are reused, and each rule gets its merged
    overrides. So a change costs the overrides it adds plus a merge of the entries in
    force (dict and tuple work in C), not a compile of every glob of every override."""
    rules_by_name: dict[str, RuleSpec] | None = None
    known = {**policy.runtime_overrides, **(compiled or {})}
    fresh: dict[str, CompiledOverride] = {}
    for override_id, override in runtime:
        found = known.get(override_id)
        if found is None or (found.spec is not override and found.spec != override):
            rules_by_name = rules_by_name or {rule.name: rule for rule in policy.spec.rules}
            found = compile_runtime_override(policy.spec, override_id, override, rules_by_name)
        fresh[override_id] = found
    overrides = _merge([*fresh.values(), *policy.file_overrides])
    rules = tuple(
        replace(rule, overrides=overrides.get(rule.name) or Overrides()) for rule in policy.rules
    )
    return replace(policy, rules=rules, idle_overrides=_idle(fresh), runtime_overrides=fresh)


def compile_runtime_override(
    spec: PolicySpec,
    override_id: str,
    override: OverrideSpec,
    rules_by_name: Mapping[str, RuleSpec] | None = None,
) -> CompiledOverride:
    """One runtime override compiled against the file `spec` (`idle` if it does not fit)."""
    rules_by_name = rules_by_name or {rule.name: rule for rule in spec.rules}
    compiled, _ = _compile_override(spec, rules_by_name, override, ("runtime", override_id))
    return compiled


def _idle(runtime: Mapping[str, CompiledOverride]) -> dict[str, str]:
    return {i: c.idle for i, c in runtime.items() if c.idle is not None}


def _compile_rule(
    spec: PolicySpec, index: int, rule: RuleSpec, overrides: Overrides | None
) -> Rule:
    limit = _rule_limit(spec, rule)
    access = isinstance(limit, AccessLimit)
    return Rule(
        name=rule.name,
        index=index,
        match=_compile_match(rule.match, kinds=_kinds(rule)),
        unless=None if rule.unless is None else _compile_match(rule.unless, cut_holds=False),
        per=() if access else tuple(rule.per),  # an access rule has no counter
        limit=limit,
        mode=rule.mode or spec.defaults.mode,
        on_exceed=limit.answer if isinstance(limit, AccessLimit) else rule.on_exceed,
        fail=rule.fail,
        label=rule.label,
        template=_template(rule),
        overrides=overrides or Overrides(),
    )


def _template(rule: RuleSpec) -> Template:
    """The rule's sentence: an access rule's text, its `message:`, else the default (for
    a rate rule counted per identical call, the one that says to change course; keyed on
    results, the one that says the result repeats)."""
    text = rule.deny or rule.ask or rule.message
    if text is not None:
        return compile_template(text, rule.kind)
    if rule.kind is RuleKind.RATE and rule.rate is not None and rule.rate.tokens:
        return default_template(TOKEN_RATE)
    if rule.kind is RuleKind.RATE and rule.same_result:
        return default_template(SAME_RESULT)
    if rule.kind is RuleKind.RATE and Dimension.ARGS in rule.per:
        return default_template(REPEATED)
    return default_template(rule.kind)


def _rule_limit(
    spec: PolicySpec, rule: RuleSpec | OverrideSpec, base: RuleSpec | None = None
) -> Bounded:
    """The limit `rule` states; for an override, what it changes of its `base` rule."""
    base = base or rule  # type: ignore[assignment]
    assert isinstance(base, RuleSpec)
    if base.kind is RuleKind.ACCESS:
        return AccessLimit(OnExceed.DENY if base.deny is not None else OnExceed.ASK)
    if base.budget is not None:
        budget = rule.budget or base.budget
        return BudgetLimit(budget, base.currency or "USD", base.soft_limit)
    if base.concurrency is not None:
        slots = base.concurrency if rule.concurrency is None else rule.concurrency
        return ConcurrencyLimit(slots, base.lease_timeout or spec.defaults.lease_timeout)
    return _rate_limit(spec, rule, base)


def _rate_limit(spec: PolicySpec, rule: RuleSpec | OverrideSpec, base: RuleSpec) -> RateLimit:
    rate = rule.rate or base.rate
    assert rate is not None
    algorithm = base.algorithm or spec.defaults.algorithm
    if rate.tokens:  # counted in fixed windows (the schema refused any other algorithm)
        algorithm = Algorithm.FIXED_WINDOW
    return RateLimit(rate, algorithm, rule.burst or base.burst, bool(base.same_result))


def _kinds(rule: RuleSpec) -> frozenset[str]:
    """The kinds of call a rule covers: what its match says, else tool calls (a token
    rate: model calls, whose tokens it counts)."""
    stated = rule.match.kinds
    if stated is not None:
        return stated
    return MODEL_CALLS if rule.rate is not None and rule.rate.tokens else TOOL_CALLS


def _compile_match(
    spec: MatchSpec, *, cut_holds: bool = True, kinds: frozenset[str] | None = None
) -> Match:
    """A rule's `match` (its `kinds` worked out by `_kinds`), or its `unless:` (the
    kinds it states, None: any)."""

    def names(value: list[str] | None) -> NameSet | None:
        return None if value is None else NameSet.of(value)

    return Match(
        kinds=spec.kinds if kinds is None else kinds,
        models=names(spec.model),
        tools=names(spec.tool),
        users=names(spec.user),
        groups=None if spec.group is None else frozenset(spec.group),
        sessions=names(spec.session),
        teams=names(spec.team),
        metadata=tuple(
            (name, value) for name in METADATA_FLAGS if (value := getattr(spec, name)) is not None
        ),
        tags=None if spec.tags is None else frozenset(spec.tags),
        args=tuple(
            ArgCondition(ArgPath.parse(path), compile_condition(condition))  # type: ignore[arg-type]
            for path, condition in (spec.args or {}).items()  # (a list was refused at load)
        ),
        cut_holds=cut_holds,
    )


def _compile_override(
    spec: PolicySpec,
    rules: Mapping[str, RuleSpec],
    override: OverrideSpec,
    where: tuple[str, str | int],
) -> tuple[CompiledOverride, list[PolicyIssue]]:
    """One override's entries for each level of precedence, and what does not fit; one
    that does not fit has no entries (a runtime one is left out; the file's is refused)."""
    rule = rules.get(override.rule)
    if rule is None:  # a runtime one (references.py checked the file's)
        return CompiledOverride(override, override.rule, idle=f"rule: no rule "
                                f"{override.rule!r} in the policy"), []  # fmt: skip
    found = [
        PolicyIssue((*where, "groups"), f"unknown group {group!r}")
        for group in override.groups or []
        if group not in spec.groups
    ]
    limit = _override_limit(spec, rule, override, where, found)
    if found:
        return CompiledOverride(override, rule.name, idle=_why(found[0])), found
    origin = f"runtime override {where[1]}" if where[0] == "runtime" else f"overrides[{where[1]}]"
    exact: dict[str, tuple[Limit, str]] = {}
    globs = []
    for user in override.users or []:
        if is_glob(user):
            globs.append((compile_glob(user), limit, origin))
        else:
            exact.setdefault(user, (limit, origin))
    groups = tuple((group, limit, origin) for group in override.groups or [])
    return CompiledOverride(override, rule.name, exact, groups, tuple(globs)), []


def _why(issue: PolicyIssue) -> str:
    return f"{issue.path[-1]}: {issue.message}"


def _merge(compiled: Sequence[CompiledOverride]) -> dict[str, Overrides]:
    """Each rule's overrides from compiled ones in precedence order (the first wins at
    each level): exact users in one dict, groups and globs in one tuple each."""
    exact: dict[str, dict[str, tuple[Limit, str]]] = {}
    groups: dict[str, list[tuple[str, Limit, str]]] = {}
    globs: dict[str, list[tuple[Glob, Limit, str]]] = {}
    for one in reversed(compiled):  # a later update wins: the first in order, as it must
        if one.idle is None and one.exact:
            exact.setdefault(one.rule, {}).update(one.exact)
    for one in compiled:
        if one.idle is None:
            groups.setdefault(one.rule, []).extend(one.groups)
            globs.setdefault(one.rule, []).extend(one.globs)
    return {
        name: Overrides(
            exact.get(name, {}), tuple(groups.get(name, ())), tuple(globs.get(name, ()))
        )
        for name in {*exact, *groups, *globs}
    }


def _override_limit(
    spec: PolicySpec,
    rule: RuleSpec,
    override: OverrideSpec,
    where: tuple[str, str | int],
    issues: list[PolicyIssue],
) -> Limit:
    if override.unlimited:
        return Unlimited()
    kind = rule.kind
    if kind is RuleKind.ACCESS:  # nothing to change but whether it applies
        given = [*limits_in(vars(override)), *(["burst"] if override.burst else [])]
        issues.append(
            PolicyIssue(
                (*where, given[0] if given else "unlimited"),
                f"rule {rule.name!r} is an access rule: an override can only lift it "
                "(unlimited: true)",
            )
        )
        return Unlimited()
    for other in limits_in(vars(override)):
        if other != kind:
            issues.append(
                PolicyIssue(
                    (*where, other.value),
                    f"rule {rule.name!r} is a {kind} rule, not {other}",
                )
            )
    if override.burst is not None and (
        kind != RuleKind.RATE or rule.algorithm != Algorithm.TOKEN_BUCKET
    ):
        issues.append(PolicyIssue((*where, "burst"), "burst only applies to token_bucket rules"))
    if (unit := _other_unit(rule, override)) is not None:
        issues.append(PolicyIssue((*where, "rate"), unit))
    limit = _rule_limit(spec, override, rule)
    if isinstance(limit, RateLimit) and (
        problem := sliding_cap_problem(limit.rate, limit.algorithm)
    ):
        issues.append(PolicyIssue((*where, "rate"), problem))  # the rule's cap holds for it too
    return limit


def compile_prices(spec: PolicySpec) -> Prices:
    """The policy's model prices: its `models:` lines, genai-prices, its default."""
    default = spec.defaults.model_price
    return Prices(
        [(pattern, price_of(line.model_dump())) for pattern, line in spec.models.items()],
        None if default is None else price_of(default.model_dump()),
    )


def unpriced_models(spec: PolicySpec, prices: Prices) -> list[PolicyIssue]:
    """A rule naming a model (exactly) whose price nothing knows: with no default price,
    its every call would be refused (docs/budgets.md, "Prices")."""
    if prices.default is not None:
        return []
    return [
        PolicyIssue(
            ("rules", i, "match", "model"),
            f"no price is known for model {model!r}: add it to the policy's models, or "
            "set defaults.model_price",
        )
        for i, rule in enumerate(spec.rules)
        for model in rule.match.model or ()
        if not is_glob(model) and not prices.known(model)
    ]


def _other_unit(rule: RuleSpec, override: OverrideSpec) -> str | None:
    """What is wrong with an override's rate counting calls for a rule counting tokens,
    or the other way round (None: nothing)."""
    if override.rate is None or rule.rate is None or override.rate.tokens == rule.rate.tokens:
        return None
    return f"rule {rule.name!r} counts {'tokens' if rule.rate.tokens else 'calls'}"


def model_currencies(spec: PolicySpec) -> list[PolicyIssue]:
    """A budget in another currency than USD, over model calls: their prices are USD."""
    return [
        PolicyIssue(
            ("rules", i, "currency"),
            f"model calls are priced in USD: a {rule.currency} budget cannot count them "
            "(match them out with kind: tool)",
        )
        for i, rule in enumerate(spec.rules)
        if rule.budget is not None
        and rule.currency not in (None, "USD")
        and CallKind.MODEL in _kinds(rule)
    ]


def _default_tool(spec: PolicySpec) -> ToolEntry:
    entry = spec.tools.get("default")
    return _tool_entry(entry) if entry else ToolEntry(None, 0.0)


def _tool_entry(entry: ToolSpec) -> ToolEntry:
    flags = {name: getattr(entry, name) for name in METADATA_FLAGS}
    said = any(value is not None for value in flags.values())
    return ToolEntry(entry.label, entry.cost, ToolFacts(**flags) if said else None)
